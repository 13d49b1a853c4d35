// cuda-criu selftest: a built-in CUDA workload checkpointed and restored through CRIU with our plugin,
// its data checked afterwards. Each step prints one line with its time.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "cli.h"
#include "image/image.h"
#include "os/proc.h"
#include "os/unique_fd.h"
#include "preflight.h"
#include "roundtrip/criu.h"
#include "roundtrip/logs.h"
#include "roundtrip/processes.h"
#include "roundtrip/signals.h"
#include "roundtrip/workdir.h"
#include "subprocess.h"
#include "units.h"

namespace cuda_criu::cli {
namespace {

using roundtrip::Clock;
using roundtrip::LogBlock;
using roundtrip::seconds_since;

constexpr unsigned kCriuMs = 600 * 1000;

struct SelftestOptions {
	std::string criu;
	std::string libdir = kCriuDefaultLibdir;
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

class Selftest {
public:
	explicit Selftest(SelftestOptions o) : o_(std::move(o)) {}

	~Selftest()
	{
		// The workload never outlives the selftest, whichever way it ends.
		workload_.kill_and_reap();
		if (stray_pid_ > 0 && process_exists(stray_pid_)) {
			std::ifstream f("/proc/" + std::to_string(stray_pid_) + "/cmdline");
			std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
			if (cmd.find(kSelftestWorkloadCommand) != std::string::npos && cmd.find(work_dir_) != std::string::npos)
				kill(stray_pid_, SIGKILL);
		}
		if (!work_dir_.empty()) {
			if (passed_ && !o_.keep)
				work_.clear();
			else
				std::printf("work directory kept: %s\n", work_dir_.c_str());
		}
	}

	int run()
	{
		if (!setup() || !start() || !dump() || !wait_exit() || !restore() || !verify()) {
			std::printf("FAIL  selftest: the round trip did not work (see above)\n");
			return kExitFailure;
		}
		passed_ = true;
		std::printf("PASS  selftest: %lu MiB of GPU memory checkpointed and restored through CRIU in %.2f s, data "
			    "intact\n",
			    o_.mb, seconds_since(t0_));
		return kExitOk;
	}

private:
	void ok(const char *step, const std::string &detail, double secs)
	{
		std::printf("ok    %-8s %7.2f s  %s\n", step, secs, detail.c_str());
		std::fflush(stdout);
	}

	// log: the lines that explain the failure (a CRIU log's errors and the plugin's lines, or the end of
	// the workload's output).
	bool fail(const char *step, const std::string &detail, const std::string &hint = {},
		  const std::vector<LogBlock> &logs = {})
	{
		std::printf("FAIL  %-8s %s\n", step, detail.c_str());
		if (!hint.empty())
			std::printf("      hint: %s\n", hint.c_str());
		for (const LogBlock &log : logs) {
			if (log.lines.empty())
				continue;
			std::printf("      %s:\n", log.file.c_str());
			for (const std::string &l : log.lines)
				std::printf("        %s\n", l.c_str());
		}
		std::fflush(stdout);
		return false;
	}

	std::vector<LogBlock> workload_tail() const { return {roundtrip::tail_of(workload_log_)}; }

	std::vector<std::string> criu_env() const
	{
		std::vector<std::string> env;
		if (!o_.libcuda.empty())
			env.push_back("CUDA_CRIU_LIBCUDA=" + o_.libcuda);
		return env;
	}

	bool setup()
	{
		t0_ = Clock::now();
		auto t = Clock::now();
		if (geteuid() != 0)
			return fail("setup", "not root", "CRIU needs root: run 'sudo cuda-criu selftest'");
		Preflight criu = preflight_criu_and_plugin(o_.criu, o_.libdir);
		if (!criu.ok)
			return fail("setup", criu.message, criu.hint);
		criu_.emplace(roundtrip::CriuSetup{criu.criu, o_.libdir, criu_env(), {}}, work_);
		auto d = open_driver(o_.libcuda);
		if (!d)
			return fail("setup", d.error().message(), "cuda-criu check tells more");
		driver_ = *d;
		auto gpus = driver_->gpus();
		if (!gpus || gpus->empty())
			return fail("setup", gpus ? "the driver sees no GPU" : gpus.error().message(),
				    "cuda-criu check tells more");

		auto work = roundtrip::WorkDir::make_temp(o_.parent_dir, "cuda-criu-selftest");
		if (!work)
			return fail("setup", work.error().message());
		work_ = std::move(*work);
		work_dir_ = work_.path();
		images_ = work_dir_ + "/images";
		state_file_ = work_dir_ + "/workload.state";
		if (auto made = work_.make_dir("images"); !made)
			return fail("setup", made.error().message());
		// The restored workload is CRIU's child; once CRIU exits it is reparented here, to be waited for.
		if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
			return fail("setup", "prctl(PR_SET_CHILD_SUBREAPER): " + errno_string(errno));
		ok("setup",
		   format("CRIU %s (%s), plugin %s, GPU 0 %s (%s), driver %s; work directory %s", criu.version.text.c_str(),
			  criu.criu.c_str(), criu.plugin.c_str(), (*gpus)[0].name.c_str(), (*gpus)[0].uuid.str().c_str(),
			  driver_->version().c_str(), work_dir_.c_str()),
		   seconds_since(t));
		return true;
	}

	bool start()
	{
		auto t = Clock::now();
		auto self = self_executable();
		if (!self)
			return fail("start", self.error().message());
		workload_log_ = work_dir_ + "/workload.log";
		auto log = work_.create_file("workload.log");
		if (!log)
			return fail("start", log.error().message());
		SpawnOptions so;
		so.argv = {*self, kSelftestWorkloadCommand, "--mb", std::to_string(o_.mb), "--state", state_file_};
		if (!o_.libcuda.empty())
			so.argv.insert(so.argv.end(), {"--libcuda", o_.libcuda});
		// CRIU dumps a session leader without a terminal and with plain files as stdio, no options needed.
		so.new_session = true;
		so.stdout_fd = so.stderr_fd = log->get();
		so.cwd = "/";
		auto child = Child::spawn(so);
		if (!child)
			return fail("start", child.error().message());
		workload_ = std::move(*child);
		pid_ = workload_.pid();

		const unsigned limit_s = 120 + static_cast<unsigned>(o_.mb / 16);
		for (;;) {
			auto state = read_state(state_file_);
			std::string status = status_of(state);
			if (!status.empty() && status != "ok")
				return workload_failed(status);
			if (status == "ok" && iterations_of(state) >= 1) {
				device_ = state["device"];
				break;
			}
			if (auto st = workload_.wait(1); st) {
				// It may have said why just before it ended.
				status = status_of(read_state(state_file_));
				if (!status.empty() && status != "ok")
					return workload_failed(status);
				return fail("start", "the workload " + describe_wait_status(*st) + " before it was ready", {},
					    workload_tail());
			}
			if (seconds_since(t) >= limit_s)
				return fail("start", format("the workload did not fill and check its memory within %u s", limit_s),
					    {}, workload_tail());
			roundtrip::pause_ms(roundtrip::kPollMs);
		}
		auto cuda = driver_->state(pid_);
		if (!cuda || *cuda != CudaState::Running)
			return fail("start", format("pid %d: the driver reports %s, not running", pid_,
						    cuda ? to_string(*cuda) : cuda.error().message().c_str()));
		ok("start", format("pid %d filled %lu MiB on %s and checked it", pid_, o_.mb, device_.c_str()),
		   seconds_since(t));
		return true;
	}

	bool workload_failed(const std::string &status)
	{
		return fail("start", "the workload failed: " + status,
			    status.find("cannot load") != std::string::npos
				    ? "the workload loads libcuda.so.1 through the loader's search path; give --libcuda PATH "
				      "to name the library"
				    : std::string(),
			    workload_tail());
	}

	// Fails step with what explains CRIU's failure.
	bool criu_failed(const char *step, const roundtrip::CriuResult &r, const std::string &log)
	{
		return fail(step, r.message, r.logs.empty() || r.timed_out ? std::string() : "the whole log: " + log, r.logs);
	}

	bool dump()
	{
		auto t = Clock::now();
		iterations_at_dump_ = iterations_of(read_state(state_file_));
		if (auto r = criu_->dump(pid_, images_, "1", {}, kCriuMs); !r.ok)
			return criu_failed("dump", r, images_ + "/dump.log");
		double secs = seconds_since(t);
		UniqueFd dir(open(images_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
		auto img = read_image(dir.get());
		if (!img)
			return fail("dump", "the image: " + img.error().message());
		if (!img->has_value())
			return fail("dump", format("CRIU dumped pid %d without cuda_plugin.so: the image has no %s", pid_,
						   kImageFileName),
				    "is " + o_.libdir + "/" + kPluginFileName + " loadable? see " + images_ + "/dump.log",
				    {roundtrip::criu_log_excerpt(images_ + "/dump.log")});
		const ImageRecord &r = **img;
		const ProcessRecord *p = nullptr;
		for (const ProcessRecord &pr : r.processes)
			if (pr.pid == pid_)
				p = &pr;
		if (!p)
			return fail("dump", format("the plugin's image does not list pid %d", pid_));
		ok("dump",
		   format("criu dump: GPU state %s checkpointed in %.3f s (lock %.1f ms); image %s", mib(p->state_bytes).c_str(),
			  p->checkpoint_us / 1e6, p->lock_us / 1e3, mib(roundtrip::tree_bytes(images_)).c_str()),
		   secs);
		return true;
	}

	bool wait_exit()
	{
		auto t = Clock::now();
		auto st = workload_.wait(30000);
		if (!st)
			return fail("exit", format("pid %d: %s after the dump", pid_, st.error().message().c_str()));
		iterations_at_dump_ = iterations_of(read_state(state_file_));
		ok("exit", format("pid %d %s, as CRIU ends what it dumps; it had checked its data %llu times", pid_,
				  describe_wait_status(*st).c_str(), iterations_at_dump_),
		   seconds_since(t));
		return true;
	}

	bool restore()
	{
		auto t = Clock::now();
		if (auto r = criu_->restore(images_, "1", {}, {}, kCriuMs); !r.ok)
			return criu_failed("restore", r, images_ + "/restore.log");
		double secs = seconds_since(t);
		if (!process_exists(pid_))
			return fail("restore", format("criu restore succeeded but pid %d does not exist", pid_), {},
				    {roundtrip::criu_log_excerpt(images_ + "/restore.log")});
		if (parent_of(pid_) == getpid())
			workload_ = Child::adopt(pid_);
		else
			stray_pid_ = pid_;
		ok("restore", format("criu restore: pid %d is back", pid_), secs);
		return true;
	}

	bool verify()
	{
		auto t = Clock::now();
		auto cuda = driver_->state(pid_);
		if (!cuda || *cuda != CudaState::Running)
			return fail("verify", format("pid %d: the driver reports %s, not running", pid_,
						     cuda ? to_string(*cuda) : cuda.error().message().c_str()));
		const unsigned long long want = iterations_at_dump_ + 3;
		const unsigned limit_s = 60 + static_cast<unsigned>(o_.mb / 16);
		std::map<std::string, std::string> state;
		while (seconds_since(t) < limit_s) {
			state = read_state(state_file_);
			std::string status = status_of(state);
			if (!status.empty() && status != "ok")
				return fail("verify", "the restored workload found: " + status, {}, workload_tail());
			if (iterations_of(state) >= want)
				break;
			if (workload_.running())
				if (auto st = workload_.wait(1); st) {
					status = status_of(read_state(state_file_));
					return fail("verify",
						    "the restored workload " + describe_wait_status(*st) +
							    (status.empty() || status == "ok" ? "" : ": " + status),
						    {}, workload_tail());
				}
			roundtrip::pause_ms(roundtrip::kPollMs);
		}
		if (iterations_of(state) < want)
			return fail("verify", format("the restored workload made no progress in %u s (iteration %llu, was %llu "
						     "at the dump)",
						     limit_s, iterations_of(state), iterations_at_dump_),
				    {}, workload_tail());
		if (state["pid"] != std::to_string(pid_))
			return fail("verify", "the state file was written by pid " + state["pid"]);
		ok("verify",
		   format("pid %d running on the GPU again; all %lu MiB read back intact %llu times since the restore",
			  pid_, o_.mb, iterations_of(state) - iterations_at_dump_),
		   seconds_since(t));
		return true;
	}

	SelftestOptions o_;
	Clock::time_point t0_;
	Driver *driver_ = nullptr;
	roundtrip::WorkDir work_;
	std::optional<roundtrip::Criu> criu_; // after work_: it refers to it
	std::string work_dir_, images_, state_file_, workload_log_, device_;
	Child workload_ = Child::adopt(-1);
	pid_t pid_ = 0;
	pid_t stray_pid_ = 0; // a restored workload that is not our child (not waited for, killed at the end)
	unsigned long long iterations_at_dump_ = 0;
	bool passed_ = false;
};

} // namespace

int cmd_selftest(const Args &args)
{
	ParsedArgs a;
	if (auto rc = parse_command("selftest", args,
				    {{"--criu", true, nullptr},
				     {"--libdir", true, nullptr},
				     {"--mb", true, nullptr},
				     {"--libcuda", true, nullptr},
				     {"--dir", true, nullptr},
				     {"--keep", false, nullptr}},
				    a))
		return *rc;
	if (!a.positionals.empty())
		return usage_error("selftest", "takes no arguments, got '" + a.positionals[0] + "'");
	SelftestOptions o;
	if (const std::string *v = a.value("--criu"))
		o.criu = *v;
	// CRIU runs in its image directory: paths handed to it must not be relative.
	auto absolute = [](const std::string &p) { return p.empty() || p[0] == '/' ? p : std::string(std::filesystem::absolute(p)); };
	if (const std::string *v = a.value("--libdir"))
		o.libdir = absolute(*v);
	if (const std::string *v = a.value("--libcuda"))
		o.libcuda = absolute(*v);
	if (const std::string *v = a.value("--dir"))
		o.parent_dir = *v;
	if (const std::string *v = a.value("--mb")) {
		auto mb = parse_count(*v, 1, 1 << 20);
		if (!mb)
			return usage_error("selftest", "--mb: " + mb.error().message());
		o.mb = *mb;
	}
	o.keep = a.has("--keep");
	return Selftest(std::move(o)).run();
}

} // namespace cuda_criu::cli
