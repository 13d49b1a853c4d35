// cuda-criu selftest: a built-in CUDA workload checkpointed and restored through CRIU with our plugin,
// its data checked afterwards. A client of the round trip engine (roundtrip/client.h): the engine runs
// the steps; the workload's state file tells when it is ready and whether its data survived, and each
// step prints one line with its time.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli.h"
#include "commands.h"
#include "image/image.h"
#include "roundtrip/client.h"
#include "roundtrip/cycle.h"
#include "roundtrip/logs.h"
#include "subprocess.h"
#include "units.h"

namespace cuda_criu::cli {
namespace {

using roundtrip::Check;
using roundtrip::Step;
using roundtrip::StepStatus;

struct SelftestOptions {
	std::string criu;
	std::string libdir = default_libdir();
	unsigned long mb = 256;
	std::string libcuda;
	std::string parent_dir = "/tmp";
	bool keep = false;
};

std::map<std::string, std::string> read_state(const std::string &path)
{
	std::map<std::string, std::string> kv;
	std::ifstream f(path);
	std::string line;
	while (std::getline(f, line))
		if (size_t eq = line.find('='); eq != std::string::npos)
			kv[line.substr(0, eq)] = line.substr(eq + 1);
	return kv;
}

unsigned long long iterations_of(const std::map<std::string, std::string> &state)
{
	auto it = state.find("iterations");
	return it == state.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

std::string status_of(const std::map<std::string, std::string> &state)
{
	auto it = state.find("status");
	return it == state.end() ? "" : it->second;
}

// The time the workload has to be ready, and to make progress again after the restore.
unsigned start_limit_s(unsigned long mb) { return 120 + static_cast<unsigned>(mb / 16); }
unsigned verify_limit_s(unsigned long mb) { return 60 + static_cast<unsigned>(mb / 16); }

class SelftestClient final : public roundtrip::Client {
public:
	explicit SelftestClient(const SelftestOptions &o) : o_(o) {}

	std::string command_line() const override { return "cuda-criu selftest"; }

	Result<roundtrip::WorkDir> make_work_dir() override
	{
		auto work = roundtrip::WorkDir::make_temp(o_.parent_dir, "cuda-criu-selftest");
		if (work) {
			state_file_ = work->file("workload.state");
			workload_log_ = work->file(log_name());
			images_ = work->file(images(1));
		}
		return work;
	}

	std::vector<std::string> command() const override
	{
		std::vector<std::string> argv = {self_, kSelftestWorkloadCommand, "--mb", std::to_string(o_.mb),
						 "--state", state_file_};
		if (!o_.libcuda.empty())
			argv.insert(argv.end(), {"--libcuda", o_.libcuda});
		return argv;
	}

	std::string images(unsigned /*cycle*/) const override { return "images"; }
	std::string log_name() const override { return "workload.log"; }
	bool keep_after_failure() const override { return true; }
	bool has_criterion() const override { return true; }

	Check look(const char *phase, pid_t pid, const std::string &ended) override
	{
		auto state = read_state(state_file_);
		std::string status = status_of(state);
		bool bad = !status.empty() && status != "ok";
		if (std::string(phase) == "start") {
			if (bad)
				return workload_failed(status);
			if (!ended.empty())
				return Check::failed("the workload " + ended + " before it was ready", {}, workload_tail());
			if (status != "ok" || iterations_of(state) < 1)
				return Check::not_yet();
			if (Check c = driver_running(pid); c.verdict == Check::Verdict::Failed)
				return c;
			return Check::ok(
				format("pid %d filled %lu MiB on %s and checked it", pid, o_.mb, state["device"].c_str()));
		}
		if (!checked_driver_) {
			checked_driver_ = true;
			if (Check c = driver_running(pid); c.verdict == Check::Verdict::Failed)
				return c;
		}
		if (!ended.empty())
			return Check::failed("the restored workload " + ended + (bad ? ": " + status : ""), {},
					     workload_tail());
		if (bad)
			return Check::failed("the restored workload found: " + status, {}, workload_tail());
		last_iterations_ = iterations_of(state);
		if (last_iterations_ < iterations_at_dump_ + 3)
			return Check::not_yet();
		if (state["pid"] != std::to_string(pid))
			return Check::failed("the state file was written by pid " + state["pid"]);
		return Check::ok(
			format("pid %d running on the GPU again; all %lu MiB read back intact %llu times since the restore",
			       pid, o_.mb, last_iterations_ - iterations_at_dump_));
	}

	Check not_met(const char *phase) override
	{
		if (std::string(phase) == "start")
			return Check::failed(format("the workload did not fill and check its memory within %u s",
						    start_limit_s(o_.mb)),
					     {}, workload_tail());
		return Check::failed(format("the restored workload made no progress in %u s (iteration %llu, was %llu "
					    "at the dump)",
					    verify_limit_s(o_.mb), last_iterations_, iterations_at_dump_),
				     {}, workload_tail());
	}

	Check setup(const Preflight &criu, const roundtrip::WorkDir &work) override
	{
		auto self = self_executable();
		if (!self)
			return Check::failed(self.error().message());
		self_ = *self;
		auto d = open_driver(o_.libcuda);
		if (!d)
			return Check::failed(d.error().message(), "cuda-criu check tells more");
		driver_ = *d;
		auto gpus = driver_->gpus();
		if (!gpus || gpus->empty())
			return Check::failed(gpus ? "the driver sees no GPU" : gpus.error().message(),
					     "cuda-criu check tells more");
		return Check::ok(format("CRIU %s (%s), plugin %s, GPU 0 %s (%s), driver %s; work directory %s",
					criu.version.text.c_str(), criu.criu.c_str(), criu.plugin.c_str(),
					(*gpus)[0].name.c_str(), (*gpus)[0].uuid.str().c_str(), driver_->version().c_str(),
					work.path().c_str()));
	}

	Check dumped(const roundtrip::Dumped &d) override
	{
		if (!d.image)
			return Check::failed(format("CRIU dumped pid %d without cuda_plugin.so: the image has no %s", d.pid,
						    kImageFileName),
					     "is " + o_.libdir + "/" + kPluginFileName + " loadable? see " + d.dir + "/dump.log",
					     {roundtrip::criu_log_excerpt(d.dir + "/dump.log")});
		for (const ProcessRecord &p : d.image->processes)
			if (p.pid == d.pid)
				return Check::ok(format("criu dump: GPU state %s checkpointed in %.3f s (lock %.1f ms); image %s",
							mib(p.state_bytes).c_str(), p.checkpoint_us / 1e6, p.lock_us / 1e3,
							mib(d.image_bytes).c_str()));
		return Check::failed(format("the plugin's image does not list pid %d", d.pid));
	}

	Check exited(pid_t pid, std::optional<int> status) override
	{
		iterations_at_dump_ = iterations_of(read_state(state_file_));
		return Check::ok(format("pid %d %s, as CRIU ends what it dumps; it had checked its data %llu times", pid,
					status ? describe_wait_status(*status).c_str() : "is gone", iterations_at_dump_));
	}

	Check restored(pid_t pid) override { return Check::ok(format("criu restore: pid %d is back", pid)); }

	std::string criu_hint(const Step &s, const roundtrip::CriuResult &r) const override
	{
		if (r.logs.empty() || r.timed_out)
			return {};
		return "the whole log: " + images_ + "/" + s.name + ".log";
	}

	void print(const Step &s) const override
	{
		// The engine's health step is this workload's check of its data.
		const char *name = s.name == "health" ? "verify" : s.name.c_str();
		if (s.status == StepStatus::Ok)
			std::printf("ok    %-8s %7.2f s  %s\n", name, s.seconds, s.detail.c_str());
		else
			std::printf("FAIL  %-8s %s\n", name, s.detail.c_str());
		if (!s.hint.empty())
			std::printf("      hint: %s\n", s.hint.c_str());
		for (const roundtrip::LogBlock &log : s.logs) {
			std::printf("      %s:\n", log.file.c_str());
			for (const std::string &l : log.lines)
				std::printf("        %s\n", l.c_str());
		}
		std::fflush(stdout);
	}

	int show_result(const roundtrip::RunInfo &run, const std::vector<Step> &steps) const override
	{
		bool passed = !roundtrip::failed_step(steps);
		if (passed)
			std::printf("PASS  selftest: %lu MiB of GPU memory checkpointed and restored through CRIU in %.2f s, "
				    "data intact\n",
				    o_.mb, run.seconds);
		else
			std::printf("FAIL  selftest: the round trip did not work (see above)\n");
		if (run.images_kept)
			std::printf("work directory kept: %s\n", run.work_dir.c_str());
		return passed ? kExitOk : kExitFailure;
	}

private:
	std::vector<roundtrip::LogBlock> workload_tail() const { return {roundtrip::tail_of(workload_log_)}; }

	Check driver_running(pid_t pid) const
	{
		auto cuda = driver_->state(pid);
		if (!cuda || *cuda != CudaState::Running)
			return Check::failed(format("pid %d: the driver reports %s, not running", pid,
						    cuda ? to_string(*cuda) : cuda.error().message().c_str()));
		return Check::ok();
	}

	Check workload_failed(const std::string &status) const
	{
		return Check::failed("the workload failed: " + status,
				     status.find("cannot load") != std::string::npos
					     ? "the workload loads libcuda.so.1 through the loader's search path; give "
					       "--libcuda PATH to name the library"
					     : std::string(),
				     workload_tail());
	}

	const SelftestOptions &o_;
	Driver *driver_ = nullptr;
	std::string self_, state_file_, workload_log_, images_;
	unsigned long long iterations_at_dump_ = 0;
	unsigned long long last_iterations_ = 0;
	bool checked_driver_ = false;
};

} // namespace

int cmd_selftest(const Invocation &in)
{
	const ParsedArgs &a = in.args;
	SelftestOptions o;
	a.get("--criu", o.criu);
	// CRIU runs in its image directory: paths handed to it must not be relative.
	auto absolute = [](const std::string &p) {
		return p.empty() || p[0] == '/' ? p : std::string(std::filesystem::absolute(p));
	};
	if (const std::string *v = a.value("--libdir"))
		o.libdir = absolute(*v);
	if (const std::string *v = a.value("--libcuda"))
		o.libcuda = absolute(*v);
	a.get("--dir", o.parent_dir);
	if (const std::string *v = a.value("--mb")) {
		auto mb = parse_count(*v, 1, 1 << 20);
		if (!mb)
			return usage_error("selftest", "--mb: " + mb.error().message());
		o.mb = *mb;
	}
	o.keep = a.has("--keep");

	roundtrip::RoundtripOptions r;
	r.name = "selftest";
	r.criu = o.criu;
	r.libdir = o.libdir;
	r.keep_images = o.keep;
	// A working directory that is there at the restore, wherever this was run from.
	r.cwd = "/";
	r.start_ms = start_limit_s(o.mb) * 1000;
	r.health_ms = verify_limit_s(o.mb) * 1000;
	// Its data checked three times after the restore is the proof that it lives on.
	r.settle_ms = 0;
	if (!o.libcuda.empty())
		r.criu_env.push_back("CUDA_CRIU_LIBCUDA=" + o.libcuda);
	SelftestClient client(o);
	return roundtrip::run_roundtrip(std::move(r), client);
}

} // namespace cuda_criu::cli
