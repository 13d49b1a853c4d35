// A client of the round trip engine (roundtrip/cycle.h). The engine runs the steps: it sets up, starts
// the program, dumps and restores it with CRIU, waits for it to be gone and to be healthy again, and
// removes what it started and made. A client brings what is its own: where the work goes, its own
// evidence that the program is ready and healthy (else the engine's --ready/--health-cmd criterion),
// checks and details of its own at each step, and how the steps and the result are shown.
// `cuda-criu roundtrip` is the default client (RoundtripClient: a table, JSON and JUnit reports);
// `cuda-criu selftest` is another (its built-in workload and that workload's state file).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "image/image.h"
#include "criu_check.h"
#include "roundtrip/criu.h"
#include "roundtrip/options.h"
#include "roundtrip/report.h"
#include "roundtrip/workdir.h"

namespace cuda_criu::cli::roundtrip {

// What a client found at a step: Ok (detail: the step's detail, empty to keep the engine's), NotYet
// (while the engine waits for the program), or Failed (detail, hint and the lines that explain it).
struct Check {
	enum class Verdict { Ok, NotYet, Failed };
	Verdict verdict = Verdict::Ok;
	std::string detail;
	std::string hint;
	std::vector<LogBlock> logs;

	static Check ok(std::string detail = {}) { return {Verdict::Ok, std::move(detail), {}, {}}; }
	static Check not_yet() { return {Verdict::NotYet, {}, {}, {}}; }
	static Check failed(std::string detail, std::string hint = {}, std::vector<LogBlock> logs = {})
	{
		return {Verdict::Failed, std::move(detail), std::move(hint), std::move(logs)};
	}
};

// What a dump left: image is the plugin's record, nullptr when the dump holds none.
struct Dumped {
	pid_t pid = 0;
	std::string dir;
	uint64_t image_bytes = 0;
	const ImageRecord *image = nullptr;
};

class Client {
public:
	virtual ~Client() = default;

	// ---- where the work goes ----
	// How the user runs this client, for the hint when not root: "cuda-criu roundtrip ...".
	virtual std::string command_line() const = 0;
	virtual Result<WorkDir> make_work_dir() = 0;
	// The program to start, once the work directory is made (argv[0] is looked up in $PATH when it has
	// no slash).
	virtual std::vector<std::string> command() const = 0;
	// The image directory of a cycle, in the work directory.
	virtual std::string images(unsigned cycle) const { return "images-" + std::to_string(cycle); }
	// The file the program's output goes to, in the work directory.
	virtual std::string log_name() const { return "program.log"; }
	// Whether the work directory stays after a run that failed past setup (its images and logs), unless
	// it was interrupted.
	virtual bool keep_after_failure() const { return false; }

	// ---- its own evidence (instead of the engine's --ready and --health-cmd criterion) ----
	virtual bool has_criterion() const { return false; }
	// Whether the program is ready (phase "start") or healthy again ("restore"). ended: how the
	// program's root process ended ("exited with status 1"), empty while it runs; the look must then
	// fail. Ok's detail is the step's whole detail.
	virtual Check look(const char * /*phase*/, pid_t /*pid*/, const std::string & /*ended*/) { return Check::ok(); }
	// The failure when the criterion still does not hold at the step's deadline.
	virtual Check not_met(const char *phase) { return Check::failed(std::string(phase) + ": not met"); }

	// ---- checks and details of its own, after the engine's part of a step has passed ----
	virtual Check setup(const Preflight & /*criu*/, const WorkDir & /*work*/) { return Check::ok(); }
	virtual Check dumped(const Dumped & /*dump*/) { return Check::ok(); }
	// status: the root process's wait status, nullopt when it was not a child here.
	virtual Check exited(pid_t /*pid*/, std::optional<int> /*status*/) { return Check::ok(); }
	virtual Check restored(pid_t /*pid*/) { return Check::ok(); }
	// The hint for a failed criu dump or restore (s is the step), "" for one the logs suggest.
	virtual std::string criu_hint(const Step & /*s*/, const CriuResult & /*r*/) const { return {}; }

	// ---- how it is shown ----
	virtual void heading() const {}
	// A step that has ended.
	virtual void print(const Step &s) const = 0;
	// After the cleanup: shows the result, writes reports, and returns the exit status.
	virtual int show_result(const RunInfo &run, const std::vector<Step> &steps) const = 0;
};

// A round trip not tried because this is not root (CRIU needs root): one line on stderr, "cuda-criu
// roundtrip: needs root, as CRIU does: run 'sudo cuda-criu roundtrip ...'", no table nor report; returns
// the exit status (kExitRoundtripNotRun).
int refuse_not_root(const Client &client);

// cuda-criu roundtrip's own client: its --dir, its table, the JSON and JUnit reports.
class RoundtripClient final : public Client {
public:
	explicit RoundtripClient(const RoundtripOptions &o) : o_(o) {}

	std::string command_line() const override { return "cuda-criu roundtrip ..."; }
	Result<WorkDir> make_work_dir() override { return WorkDir::create(o_.dir); }
	std::vector<std::string> command() const override { return o_.command; }
	void heading() const override { print_heading(o_.name, o_.command); }
	std::string criu_hint(const Step &s, const CriuResult &r) const override;
	void print(const Step &s) const override { print_step(s); }
	int show_result(const RunInfo &run, const std::vector<Step> &steps) const override;

private:
	const RoundtripOptions &o_;
};

} // namespace cuda_criu::cli::roundtrip
