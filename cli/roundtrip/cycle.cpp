// Processes: this program makes itself a child subreaper, so that everything the program forks, and
// everything `criu restore -d` brings back, ends up as its descendant; the cleanup kills its descendants
// and reaps them (roundtrip/processes.h).
#include "roundtrip/cycle.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "cli.h"
#include "image/image.h"
#include "os/proc.h"
#include "criu_check.h"
#include "roundtrip/client.h"
#include "roundtrip/criu.h"
#include "roundtrip/logs.h"
#include "roundtrip/processes.h"
#include "roundtrip/report.h"
#include "roundtrip/workdir.h"
#include "subprocess.h"
#include "units.h"

namespace cuda_criu::cli::roundtrip {
namespace {

constexpr unsigned kCleanupMs = 30 * 1000;
constexpr long kHealthRetryMs = 250;

Step planned(unsigned cycle, const char *name)
{
	Step s;
	s.cycle = cycle;
	s.name = name;
	return s;
}

class Roundtrip {
public:
	Roundtrip(RoundtripOptions o, Client &client) : o_(std::move(o)), client_(client) {}
	Roundtrip(const Roundtrip &) = delete;
	Roundtrip &operator=(const Roundtrip &) = delete;
	~Roundtrip() { cleanup(); }

	int run();

private:
	// How one run of the health command ended.
	enum class HealthRun { Passed, Failed, NotRun, Interrupted };

	// steps
	void plan();
	Step &begin(unsigned cycle, const char *name);
	bool ok(Step &s, std::string detail);
	bool fail(Step &s, std::string detail, std::vector<LogBlock> logs = {}, std::string hint = {});
	bool fail_interrupted(Step &s);
	// s ends as the client's check says; detail: the engine's, unless the check has its own.
	bool conclude(Step &s, Check c, std::string detail);
	// before the first dump
	bool setup();
	bool start();
	bool await_ready(Step &s, Baseline &b, std::string &what);
	bool await_client(Step &s, Clock::time_point deadline, const char *phase, std::string &what);
	// readiness and health
	std::string root_ended();
	std::string ended_message(const std::string &how) const;
	bool going_on(Step &s, const std::string &before, const std::string &after);
	bool await_health(Step &s, Baseline &b, Clock::time_point deadline, const char *phase, std::string &what);
	bool health_timed_out(Step &s, const Baseline &b, const std::string &last);
	bool settle(Step &s, std::string &what);
	HealthRun run_health_cmd(Clock::time_point deadline, unsigned cycle, const char *phase, std::string &result);
	// a cycle
	bool criu_failed(Step &s, const CriuResult &r);
	std::string images(unsigned cycle) const { return client_.images(cycle); }
	bool cycle(unsigned c);
	bool dump(unsigned c);
	bool describe_dump(Step &s, const std::string &dir);
	bool wait_gone(Step &s, const char *after, std::string &what);
	bool wait_exit(unsigned c);
	bool still_running(unsigned c);
	bool kill_for_restore(unsigned c);
	bool restore(unsigned c);
	bool health(unsigned c);
	bool healthy_step(unsigned c, const char *name, Baseline &b, const char *phase, const char *how);
	// the end
	void cleanup();
	RunInfo run_info() const;

	RoundtripOptions o_;
	Client &client_;
	Clock::time_point t0_;
	Clock::time_point step_t0_;
	std::time_t started_unix_ = 0;
	std::vector<Step> steps_;
	Preflight criu_;
	WorkDir work_;
	std::optional<Criu> criu_run_;
	std::string program_log_;
	std::string health_out_;
	bool kept_ = false;
	bool cleaned_ = false;
	std::optional<ReadyProbe> probe_;
	Child program_ = Child::adopt(-1); // the program's root while it is a child here
	pid_t root_ = 0;                   // the program's root pid (the same after a restore: no pid namespace)
	std::optional<int> root_status_;   // how the root ended, when it was a child here
	std::vector<pid_t> tree_;          // the processes of the last dump
	Baseline after_dump_;
	Baseline before_restore_;
};

int Roundtrip::run()
{
	if (geteuid() != 0) // CRIU needs root
		return refuse_not_root(client_);
	SignalHandlers handlers;
	t0_ = Clock::now();
	started_unix_ = std::time(nullptr);
	plan();
	client_.heading();

	bool good = setup() && start();
	for (unsigned c = 1; good && c <= o_.repeat; c++)
		good = cycle(c);
	cleanup();

	int status = client_.show_result(run_info(), steps_);
	std::fflush(stdout);
	handlers.restore();
	if (int signo = caught_signal(); signo != 0) {
		// Ended by the signal, as the shell or CI runner that sent it expects.
		std::signal(signo, SIG_DFL);
		std::raise(signo);
		return 128 + signo;
	}
	return status;
}

RunInfo Roundtrip::run_info() const
{
	RunInfo r;
	r.name = o_.name;
	r.command = o_.command;
	r.pid = root_;
	r.criu = criu_.criu;
	r.criu_version = criu_.version.text;
	r.libdir = o_.libdir;
	r.criu_args = o_.criu_args;
	r.work_dir = work_.path();
	r.images_kept = kept_;
	r.repeat = o_.repeat;
	r.leave_running = o_.leave_running;
	r.device_map = o_.device_map;
	r.started_unix = started_unix_;
	r.seconds = seconds_since(t0_);
	r.signal = caught_signal();
	return r;
}

// ---- steps ----

void Roundtrip::plan()
{
	steps_.push_back(planned(0, "setup"));
	steps_.push_back(planned(0, "start"));
	for (unsigned c = 1; c <= o_.repeat; c++) {
		std::vector<const char *> names = {"dump", "exit", "restore", "health"};
		if (o_.leave_running)
			names = {"dump", "running", "kill", "restore", "health"};
		for (const char *n : names)
			steps_.push_back(planned(c, n));
	}
}

Step &Roundtrip::begin(unsigned cycle, const char *name)
{
	step_t0_ = Clock::now();
	for (Step &s : steps_)
		if (s.cycle == cycle && s.name == name)
			return s;
	steps_.push_back(planned(cycle, name));
	return steps_.back();
}

bool Roundtrip::ok(Step &s, std::string detail)
{
	s.status = StepStatus::Ok;
	s.seconds = seconds_since(step_t0_);
	s.detail = std::move(detail);
	client_.print(s);
	return true;
}

bool Roundtrip::fail(Step &s, std::string detail, std::vector<LogBlock> logs, std::string hint)
{
	s.status = StepStatus::Failed;
	s.seconds = seconds_since(step_t0_);
	s.detail = std::move(detail);
	std::erase_if(logs, [](const LogBlock &b) { return b.lines.empty(); });
	s.hint = hint.empty() ? hint_for(logs) : std::move(hint);
	s.logs = std::move(logs);
	client_.print(s);
	return false;
}

bool Roundtrip::fail_interrupted(Step &s)
{
	return fail(s, format("interrupted by %s: stopping, killing what was started and removing what was created",
			      signal_name(caught_signal()).c_str()));
}

bool Roundtrip::conclude(Step &s, Check c, std::string detail)
{
	if (c.verdict == Check::Verdict::Failed)
		return fail(s, std::move(c.detail), std::move(c.logs), std::move(c.hint));
	return ok(s, c.detail.empty() ? std::move(detail) : std::move(c.detail));
}

// ---- before the first dump ----

bool Roundtrip::setup()
{
	Step &s = begin(0, "setup");
	auto work = client_.make_work_dir();
	if (!work)
		return fail(s, work.error().message());
	work_ = std::move(*work);
	program_log_ = work_.file(client_.log_name());
	health_out_ = work_.file("health.out");
	criu_ = preflight_criu_and_plugin(o_.criu, o_.libdir, o_.criu_env);
	if (!criu_.ok)
		return fail(s, criu_.message, {}, criu_.hint);
	criu_run_.emplace(CriuSetup{criu_.criu, o_.libdir, o_.criu_env, o_.criu_args}, work_);
	if (o_.ready.kind == ReadyKind::Port && port_accepts(o_.ready.port))
		return fail(s, format("127.0.0.1:%u accepts connections before the program has started", o_.ready.port), {},
			    "another process listens on that port: stop it, or wait for another port");
	auto probe = ReadyProbe::create(o_.ready, program_log_);
	if (!probe)
		return fail(s, "--ready-log: " + probe.error().message());
	probe_.emplace(std::move(*probe));
	// Whatever the program forks, and what `criu restore -d` brings back, is reparented here once its
	// parent ends: to be waited for, and killed at the end.
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
		return fail(s, "prctl(PR_SET_CHILD_SUBREAPER): " + errno_string(errno));
	return conclude(s, client_.setup(criu_, work_),
			format("CRIU %s (%s), plugin %s, work directory %s", criu_.version.text.c_str(), criu_.criu.c_str(),
			       criu_.plugin.c_str(), work_.path().c_str()));
}

bool Roundtrip::start()
{
	Step &s = begin(0, "start");
	SpawnOptions so;
	so.argv = client_.command();
	auto exe = resolve_program(so.argv[0]);
	if (!exe)
		return fail(s, exe.error().message());
	so.argv[0] = *exe;
	// O_APPEND: CRIU checks no size of such a file at restore.
	auto log = work_.create_file(client_.log_name(), O_APPEND);
	if (!log)
		return fail(s, log.error().message());
	Baseline b = probe_->baseline();
	// What CRIU needs of a process tree's root without options: no terminal (its own session), and plain
	// files as its standard streams.
	so.new_session = true;
	so.stdout_fd = so.stderr_fd = log->get();
	so.cwd = o_.cwd;
	auto child = Child::spawn(so);
	if (!child)
		return fail(s, child.error().message());
	program_ = std::move(*child);
	root_ = program_.pid();

	std::string what;
	if (client_.has_criterion())
		return await_client(s, deadline_in(o_.start_ms), "start", what) && ok(s, what);
	if (o_.ready.kind == ReadyKind::None) {
		if (!await_health(s, b, deadline_in(o_.start_ms), "start", what))
			return false;
	} else if (!await_ready(s, b, what)) {
		return false;
	}
	return ok(s, format("pid %d ready: %s", root_, what.c_str()));
}

// Waits for the readiness criterion, then for the health command when there is one: a command that
// never passes is not the restore's fault.
bool Roundtrip::await_ready(Step &s, Baseline &b, std::string &what)
{
	auto deadline = deadline_in(o_.start_ms);
	for (;;) {
		if (!going_on(s, "", " before it was ready"))
			return false;
		if (probe_->met(b, what))
			break;
		if (Clock::now() >= deadline)
			return fail(s,
				    format("the program was not ready within %g s: %s", o_.start_ms / 1000.0,
					   probe_->not_met(b).c_str()),
				    {tail_of(program_log_)}, "a slow start needs a longer --start-timeout");
		pause_ms(kPollMs);
	}
	if (o_.health_cmd.empty())
		return true;
	std::string healthy;
	if (!await_health(s, b, deadline_in(o_.health_ms), "start", healthy))
		return false;
	what += "; " + healthy;
	return true;
}

// Waits until deadline for the client's own criterion; what: the step's detail, as the client says.
bool Roundtrip::await_client(Step &s, Clock::time_point deadline, const char *phase, std::string &what)
{
	for (;;) {
		if (interrupted())
			return fail_interrupted(s);
		std::string ended = root_ended();
		Check c = client_.look(phase, root_, ended);
		if (c.verdict == Check::Verdict::Ok && ended.empty()) {
			what = std::move(c.detail);
			return true;
		}
		if (c.verdict == Check::Verdict::Failed)
			return conclude(s, std::move(c), {});
		if (!ended.empty())
			return fail(s, ended_message(ended), {tail_of(program_log_)});
		if (Clock::now() >= deadline)
			return conclude(s, client_.not_met(phase), {});
		pause_ms(kPollMs);
	}
}

// ---- readiness and health ----

// How the program's root process ended ("exited with status 1", "has ended"), "" while it runs.
std::string Roundtrip::root_ended()
{
	if (program_.running()) {
		auto st = program_.wait(1);
		return st ? describe_wait_status(*st) : std::string();
	}
	return !process_exists(root_) || is_zombie(root_) ? "has ended" : "";
}

std::string Roundtrip::ended_message(const std::string &how) const
{
	return format("the program (pid %d) %s%s", root_, how.rfind("killed", 0) == 0 ? "was " : "", how.c_str());
}

// Whether a wait for the program goes on: s fails when this program is interrupted, or when the
// program's root process has ended (its message: before, how it ended, after).
bool Roundtrip::going_on(Step &s, const std::string &before, const std::string &after)
{
	if (interrupted())
		return fail_interrupted(s);
	std::string how = root_ended();
	return how.empty() || fail(s, before + ended_message(how) + after, {tail_of(program_log_)});
}

// Waits until deadline for the program to be healthy: the health command passes when there is one, else
// the readiness criterion holds again, compared with b. Fails s when it does not.
bool Roundtrip::await_health(Step &s, Baseline &b, Clock::time_point deadline, const char *phase, std::string &what)
{
	std::string last;
	for (;;) {
		if (!going_on(s, "", ""))
			return false;
		if (!o_.health_cmd.empty()) {
			HealthRun r = run_health_cmd(deadline, s.cycle, phase, last);
			if (r == HealthRun::Interrupted)
				return fail_interrupted(s);
			if (r == HealthRun::NotRun)
				return fail(s, "the health command: " + last);
			if (r == HealthRun::Passed) {
				if (std::string how = root_ended(); !how.empty())
					return fail(s, ended_message(how), {tail_of(program_log_)});
				what = "the health command passed";
				return true;
			}
		} else if (probe_->met(b, what)) {
			return true;
		}
		if (Clock::now() >= deadline)
			return health_timed_out(s, b, last);
		pause_ms(o_.health_cmd.empty() ? kPollMs : kHealthRetryMs);
	}
}

bool Roundtrip::health_timed_out(Step &s, const Baseline &b, const std::string &last)
{
	double secs = seconds_since(b.when);
	if (!o_.health_cmd.empty())
		return fail(s, format("the health command did not pass within %.1f s: %s", secs, last.c_str()),
			    {tail_of(health_out_), tail_of(program_log_)});
	return fail(s, format("not healthy within %.1f s: %s", secs, probe_->not_met(b).c_str()), {tail_of(program_log_)},
		    probe_->kind() == ReadyKind::File || probe_->kind() == ReadyKind::Log
			    ? "a program that shows it is ready only once needs a --health-cmd"
			    : std::string());
}

// After a passed health check, the program must live on for --settle: one sign of life right after a
// restore does not show that it survived it.
bool Roundtrip::settle(Step &s, std::string &what)
{
	auto until = deadline_in(o_.settle_ms);
	for (;;) {
		if (!going_on(s, what + ", then ",
			      format(" within the %g s it had to live on (--settle)", o_.settle_ms / 1000.0)))
			return false;
		if (Clock::now() >= until)
			break;
		pause_ms(kPollMs);
	}
	if (o_.settle_ms)
		what += format(", and lived on for %g s", o_.settle_ms / 1000.0);
	return true;
}

// One run of the health command, killed at deadline. result: how it ended.
Roundtrip::HealthRun Roundtrip::run_health_cmd(Clock::time_point deadline, unsigned cycle, const char *phase,
					     std::string &result)
{
	auto out = work_.create_file("health.out");
	if (!out) {
		result = out.error().message();
		return HealthRun::NotRun;
	}
	SpawnOptions so;
	so.argv = {"/bin/sh", "-c", o_.health_cmd};
	so.stdout_fd = so.stderr_fd = out->get();
	// Its own process group: what it starts is killed with it when it overruns.
	so.new_session = true;
	so.env_set = {"ROUNDTRIP_PID=" + std::to_string(root_), "ROUNDTRIP_CYCLE=" + std::to_string(cycle),
		      std::string("ROUNDTRIP_PHASE=") + phase, "ROUNDTRIP_LOG=" + program_log_,
		      "ROUNDTRIP_DIR=" + work_.path()};
	auto child = Child::spawn(so);
	if (!child) {
		result = child.error().message();
		return HealthRun::NotRun;
	}
	for (;;) {
		auto st = child->wait(static_cast<unsigned>(kPollMs));
		if (st) {
			if (WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
				return HealthRun::Passed;
			result = describe_wait_status(*st);
			return HealthRun::Failed;
		}
		if (st.error().errno_value() != ETIMEDOUT) {
			result = st.error().message();
			return HealthRun::NotRun;
		}
		bool late = Clock::now() >= deadline;
		if (interrupted() || late) {
			kill(-child->pid(), SIGKILL); // not reaped yet: the group still exists
			child->kill_and_reap();
			if (!late)
				return HealthRun::Interrupted;
			result = "it was still running at the deadline (killed)";
			return HealthRun::Failed;
		}
	}
}

// ---- a cycle ----

// Fails s with what explains CRIU's failure (criu dump or criu restore, as the step's name says).
bool Roundtrip::criu_failed(Step &s, const CriuResult &r)
{
	if (r.interrupted)
		return fail_interrupted(s);
	return fail(s, r.message, r.logs, client_.criu_hint(s, r));
}

bool Roundtrip::cycle(unsigned c)
{
	bool good = dump(c) && (o_.leave_running ? still_running(c) && kill_for_restore(c) : wait_exit(c)) &&
		    restore(c) && health(c);
	// What ended during the cycle and is no part of the program (the plugin's guard processes, reparented
	// here) is reaped now: a long --repeat must not pile up zombies.
	reap_ended_children(program_.pid());
	if (good && !o_.keep_images) {
		// GPU images are large: each goes as soon as its cycle has passed.
		std::error_code ec;
		std::filesystem::remove_all(work_.file(images(c)), ec);
	}
	return good;
}

bool Roundtrip::dump(unsigned c)
{
	Step &s = begin(c, "dump");
	if (auto made = work_.make_dir(images(c)); !made)
		return fail(s, made.error().message());
	std::string dir = work_.file(images(c));
	tree_ = tree_of(root_);
	std::vector<std::string> more;
	if (o_.leave_running)
		more.emplace_back("--leave-running");
	// The readiness probe's own connections must not stop the dump.
	if (o_.ready.kind == ReadyKind::Port)
		more.emplace_back("--skip-in-flight");
	if (auto r = criu_run_->dump(root_, dir, std::to_string(c), more, o_.dump_ms); !r.ok)
		return criu_failed(s, r);
	after_dump_ = probe_->baseline();
	return describe_dump(s, dir);
}

// The sizes of a dump and what the plugin recorded in it; with --require-cuda, a dump without a CUDA
// process fails.
bool Roundtrip::describe_dump(Step &s, const std::string &dir)
{
	s.image_bytes = static_cast<int64_t>(tree_bytes(dir));
	std::string gpu = "no CUDA process recorded by the plugin";
	UniqueFd dfd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	auto img = read_image(dfd.get());
	if (!img)
		return fail(s, format("the plugin's image in %s: %s", dir.c_str(), img.error().message().c_str()));
	s.cuda_processes = 0;
	s.gpu_state_bytes = 0;
	Dumped dumped{root_, dir, static_cast<uint64_t>(s.image_bytes), img->has_value() ? &**img : nullptr};
	if (img->has_value()) {
		uint64_t bytes = 0;
		for (const ProcessRecord &p : (*img)->processes)
			bytes += p.state_bytes;
		s.gpu_state_bytes = static_cast<int64_t>(bytes);
		s.cuda_processes = static_cast<int>((*img)->processes.size());
		gpu = format("GPU state %s of %d CUDA process(es)", mib(bytes).c_str(), s.cuda_processes);
	}
	if (o_.require_cuda && s.cuda_processes == 0)
		return fail(s, format("the dump holds no CUDA process (--require-cuda): %s", gpu.c_str()),
			    {criu_log_excerpt(dir + "/dump.log")},
			    "is the program on the GPU yet when it is ready? is --libdir the directory of "
			    "cuda-criu's cuda_plugin.so?");
	return conclude(s, client_.dumped(dumped),
			format("%zu process(es), image %s, %s", tree_.size(), mib(s.image_bytes).c_str(), gpu.c_str()));
}

// Waits until every pid of tree_ is gone, reaping those that are children here; what: how it was seen.
bool Roundtrip::wait_gone(Step &s, const char *after, std::string &what)
{
	auto deadline = deadline_in(o_.dump_ms);
	for (;;) {
		// The root's pid is also its session's and process group's id: CRIU can give it back only once no
		// process holds it in any role, a zombie child of this subreaper (a child forked after tree_ was
		// taken) included.
		std::set<pid_t> pids(tree_.begin(), tree_.end());
		for (pid_t p : session_members(root_))
			pids.insert(p);
		std::vector<pid_t> left;
		for (pid_t p : pids) {
			if (p == program_.pid()) {
				if (auto st = program_.wait(1); st)
					root_status_ = *st;
			} else if (parent_of(p) == getpid()) {
				waitpid(p, nullptr, WNOHANG);
			}
			if (process_exists(p))
				left.push_back(p);
		}
		if (left.empty()) {
			what = format("%zu process(es) gone %s", tree_.size(), after);
			return true;
		}
		if (interrupted())
			return fail_interrupted(s);
		if (Clock::now() >= deadline) {
			std::string list;
			for (pid_t p : left)
				list += (list.empty() ? "" : " ") + std::to_string(p);
			return fail(s, format("pid(s) %s still there %g s %s", list.c_str(), o_.dump_ms / 1000.0, after),
				    {tail_of(program_log_)});
		}
		pause_ms(kPollMs);
	}
}

bool Roundtrip::wait_exit(unsigned c)
{
	Step &s = begin(c, "exit");
	root_status_.reset();
	std::string what;
	return wait_gone(s, "after the dump", what) && conclude(s, client_.exited(root_, root_status_), what);
}

bool Roundtrip::still_running(unsigned c)
{
	return healthy_step(c, "running", after_dump_, "running", "kept running after the dump");
}

// A step that waits for the program to be healthy (compared with b) and to live on for --settle.
bool Roundtrip::healthy_step(unsigned c, const char *name, Baseline &b, const char *phase, const char *how)
{
	Step &s = begin(c, name);
	std::string what;
	if (!await_health(s, b, deadline_in(o_.health_ms), phase, what) || !settle(s, what))
		return false;
	return ok(s, format("pid %d %s: %s", root_, how, what.c_str()));
}

bool Roundtrip::kill_for_restore(unsigned c)
{
	Step &s = begin(c, "kill");
	tree_ = tree_of(root_);
	for (pid_t p : session_members(root_))
		if (std::find(tree_.begin(), tree_.end(), p) == tree_.end())
			tree_.push_back(p);
	for (pid_t p : tree_)
		kill(p, SIGKILL);
	std::string what;
	return wait_gone(s, "after SIGKILL, to restore them from the image", what) && ok(s, what);
}

bool Roundtrip::restore(unsigned c)
{
	Step &s = begin(c, "restore");
	std::string dir = work_.file(images(c));
	std::string pidfile = work_.file(format("restore-%u.pid", c));
	before_restore_ = probe_->baseline();
	std::vector<std::string> env;
	if (o_.device_map)
		env.push_back("CUDA_CRIU_DEVICE_MAP=" + *o_.device_map);
	if (auto r = criu_run_->restore(dir, std::to_string(c), {"--pidfile", pidfile}, env, o_.restore_ms); !r.ok)
		return criu_failed(s, r);
	std::ifstream pf(pidfile);
	pid_t pid = 0;
	if (!(pf >> pid) || pid <= 0)
		return fail(s, "criu restore wrote no pid to " + pidfile, {criu_log_excerpt(dir + "/restore.log")});
	root_ = pid;
	before_restore_.when = Clock::now(); // --ready-delay counts from here
	if (!process_exists(root_))
		return fail(s, format("criu restore succeeded but pid %d does not exist", root_),
			    {criu_log_excerpt(dir + "/restore.log"), tail_of(program_log_)});
	// CRIU has exited: its restored tree is reparented here (subreaper), to be waited for.
	if (parent_of(root_) == getpid())
		program_ = Child::adopt(root_);
	std::string detail = format("pid %d restored", root_);
	if (int n = restored_cuda_processes(read_lines(dir + "/restore.log")); n >= 0)
		detail += format("; the plugin restored %d CUDA process(es)", n);
	if (o_.device_map)
		detail += "; device map " + *o_.device_map;
	return conclude(s, client_.restored(root_), detail);
}

bool Roundtrip::health(unsigned c)
{
	if (client_.has_criterion()) {
		Step &s = begin(c, "health");
		std::string what;
		return await_client(s, deadline_in(o_.health_ms), "restore", what) && settle(s, what) && ok(s, what);
	}
	return healthy_step(c, "health", before_restore_, "restore", "healthy after the restore");
}

// ---- the end ----

// Kills everything this program started (its descendants) and reaps it; removes the work directory
// unless the images are to be kept. Runs once.
void Roundtrip::cleanup()
{
	if (cleaned_)
		return;
	cleaned_ = true;
	program_.kill_and_reap();
	if (size_t left = 0; !kill_descendants(kCleanupMs, left))
		std::printf("warning: %zu process(es) started by the round trip did not end within %u s\n", left,
			    kCleanupMs / 1000);
	if (work_.path().empty())
		return;
	// An interrupted run removes what it made, as its message says.
	const Step *failed = failed_step(steps_);
	if (o_.keep_images || (failed && failed->name != "setup" && !caught_signal() && client_.keep_after_failure())) {
		kept_ = true;
		return;
	}
	work_.clear();
}

} // namespace

int run_roundtrip(RoundtripOptions o, Client &client) { return Roundtrip(std::move(o), client).run(); }

int run_roundtrip(const RoundtripOptions &o)
{
	RoundtripClient client(o);
	return run_roundtrip(o, client);
}

} // namespace cuda_criu::cli::roundtrip
