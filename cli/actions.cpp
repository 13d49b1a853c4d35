// lock, checkpoint, restore, unlock, suspend, resume, and the cuda-checkpoint compatible command line.
// Every process is driven on its own worker (core/parallel.h), so that one that hangs in the driver does
// not hold up the others and the wait for it can be bounded. While a checkpoint or restore copies, a
// progress line shows on stderr (core/progress.h, as the plugin's in CRIU's log), and a copy that stops
// making progress is given up after the stall timeout.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>

#include "base/clock.h"
#include "cli.h"
#include "commands.h"
#include "core/driver_calls.h"
#include "core/gpu_plan.h"
#include "core/options.h"
#include "core/parallel.h"
#include "core/progress.h"
#include "json.h"
#include "os/host.h"
#include "os/proc.h"
#include "process_errors.h"
#include "progress_display.h"

namespace cuda_criu::cli {
namespace {

struct Plan {
	std::string action;          // lock, checkpoint, restore, unlock, suspend, resume, toggle
	unsigned lock_timeout_ms = 0; // passed to the driver's lock (0: no limit)
	unsigned wait_ms = 0;         // how long to wait for a process's whole job (0: no limit)
	std::vector<GpuPair> pairs;   // for restore
};

// Which copy of the driver a job runs now, for the progress watch.
enum class Copy { None, Checkpoint, Restore, Done };

// What a job tells the progress watch (shared: a job abandoned at its deadline writes it late).
struct CopyState {
	std::atomic<Copy> copy{Copy::None};
	std::atomic<uint64_t> rss_before{0};
	std::atomic<pid_t> restore_tid{0}; // 0: unknown, the stall is then told by the bytes alone
};

// Runs the driver's copy (call: its checkpoint or restore of pid) with what the watch samples set first.
Status copy(Driver &d, pid_t pid, CopyState &c, Copy kind, const std::function<Status()> &call)
{
	if (auto tid = d.restore_thread_id(pid))
		c.restore_tid = *tid;
	if (kind == Copy::Checkpoint)
		if (auto st = read_task_status(pid))
			c.rss_before = st->rss_bytes;
	c.copy = kind;
	Status st = call();
	c.copy = Copy::Done;
	return st;
}

Status checkpoint(Driver &d, pid_t pid, CopyState &c)
{
	return copy(d, pid, c, Copy::Checkpoint, [&] { return d.checkpoint(pid); });
}

Status restore(Driver &d, pid_t pid, const Plan &plan, CopyState &c)
{
	return copy(d, pid, c, Copy::Restore, [&] { return d.restore(pid, plan.pairs); });
}

Status lock_then_checkpoint(Driver &d, pid_t pid, const Plan &plan, bool locked, CopyState &c)
{
	if (!locked)
		if (auto st = d.lock(pid, plan.lock_timeout_ms); !st)
			return std::move(st).error().context("lock");
	if (auto st = checkpoint(d, pid, c); !st)
		return std::move(st).error().context("checkpoint");
	return {};
}

Status restore_then_unlock(Driver &d, pid_t pid, const Plan &plan, bool checkpointed, CopyState &c)
{
	if (checkpointed)
		if (auto st = restore(d, pid, plan, c); !st)
			return std::move(st).error().context("restore");
	if (auto st = d.unlock(pid); !st)
		return std::move(st).error().context("unlock");
	return {};
}

Status perform(Driver &d, pid_t pid, const Plan &plan, CopyState &c)
{
	if (plan.action == "lock")
		return d.lock(pid, plan.lock_timeout_ms);
	if (plan.action == "checkpoint")
		return checkpoint(d, pid, c);
	if (plan.action == "restore")
		return restore(d, pid, plan, c);
	if (plan.action == "unlock")
		return d.unlock(pid);

	auto state = d.state(pid);
	if (!state)
		return std::move(state).error();
	if (*state == CudaState::Failed)
		return make_error(EIO, "the driver reports the process's CUDA state as failed: it cannot be %s",
				  plan.action == "suspend" ? "checkpointed" : "brought back");
	if (plan.action == "suspend") {
		if (*state == CudaState::Checkpointed)
			return {};
		return lock_then_checkpoint(d, pid, plan, *state == CudaState::Locked, c);
	}
	if (plan.action == "resume") {
		if (*state == CudaState::Running)
			return {};
		return restore_then_unlock(d, pid, plan, *state == CudaState::Checkpointed, c);
	}
	// toggle: between running and checkpointed only, as cuda-checkpoint does.
	if (*state == CudaState::Running)
		return lock_then_checkpoint(d, pid, plan, false, c);
	if (*state == CudaState::Checkpointed)
		return restore_then_unlock(d, pid, plan, true, c);
	return make_error(EINVAL, "the process is locked: --toggle goes between running and checkpointed only; use "
				  "--action checkpoint or --action unlock");
}

// GPU memory of each process from NVML (empty when it cannot tell); asked on a worker, so that an NVML
// that hangs costs a bounded wait, and not asked again after that (ok cleared).
std::map<pid_t, uint64_t> gpu_bytes(Driver *d, bool &ok)
{
	if (!ok)
		return {};
	auto m = call_within<std::map<pid_t, uint64_t>>(2000, "ask NVML for the GPU memory of each process",
							 [d]() -> Result<std::map<pid_t, uint64_t>> {
								 if (auto m = d->gpu_bytes_by_process())
									 return std::move(*m);
								 return std::map<pid_t, uint64_t>();
							 });
	if (!m) {
		ok = false;
		return {};
	}
	return std::move(*m);
}

// The watch of run_jobs for the copies of the jobs (one per pid): from the first look that finds a copy
// running, samples each process as the plugin does (checkpoint: the growth of its memory, of the GPU
// memory NVML reported then; restore: its GPU memory again, of a total nobody here knows), shows a
// line on display every second on a terminal (every 3 s otherwise; none for a call shorter than that),
// gives up a copy that stalled.
JobWatch watch_copies(Driver *d, const std::vector<pid_t> &pids, const std::vector<std::shared_ptr<CopyState>> &copies,
		      unsigned stall_ms, ProgressDisplay &display, const std::string &prefix)
{
	struct State {
		std::unique_ptr<Progress> progress;
		Copy phase = Copy::None;
		bool nvml = true;
		uint64_t start_us = now_us();
	};
	auto s = std::make_shared<State>();
	return [=, &display](const std::vector<bool> &ended) {
		std::vector<std::pair<size_t, Error>> give_up;
		uint64_t now = now_us();
		if (!s->progress) {
			for (const auto &c : copies)
				if (Copy k = c->copy; k == Copy::Checkpoint || k == Copy::Restore) {
					s->phase = k;
					break;
				}
			if (s->phase == Copy::None)
				return give_up;
			std::map<pid_t, uint64_t> gpu;
			if (s->phase == Copy::Checkpoint)
				gpu = gpu_bytes(d, s->nvml);
			std::vector<Progress::Proc> procs;
			procs.reserve(pids.size());
			for (pid_t pid : pids)
				procs.push_back({pid, gpu.count(pid) ? gpu[pid] : 0});
			uint64_t every_us = display.in_place() ? 1000000 : 3000000;
			// A restore's bytes (NVML) may stay 0 until it is done: no stall on CPU time alone there.
			s->progress = std::make_unique<Progress>(s->phase == Copy::Checkpoint ? "checkpoint" : "restore",
								 std::move(procs), stall_ms * 1000ULL, every_us, s->start_us,
								 s->phase == Copy::Restore);
		}
		std::map<pid_t, uint64_t> gpu;
		if (s->phase == Copy::Restore)
			gpu = gpu_bytes(d, s->nvml);
		for (size_t k = 0; k < pids.size(); k++) {
			const CopyState &c = *copies[k];
			Copy now_copy = c.copy;
			if (now_copy == Copy::None && !ended[k]) {
				s->progress->waiting(k, now);
				continue;
			}
			ProgressSample sample;
			if (s->phase == Copy::Checkpoint) {
				uint64_t rss = 0;
				if (auto st = read_task_status(pids[k]))
					rss = st->rss_bytes;
				sample.bytes = rss > c.rss_before ? rss - c.rss_before : 0;
			} else if (auto it = gpu.find(pids[k]); it != gpu.end()) {
				sample.bytes = it->second;
			}
			if (pid_t tid = c.restore_tid)
				sample.cpu_ticks = thread_cpu_ticks(pids[k], tid);
			s->progress->observe(k, sample, ended[k] || now_copy == Copy::Done, now);
		}
		if (auto line = s->progress->line(now))
			display.show(prefix + *line);
		if (auto k = s->progress->stalled(now)) {
			give_up.emplace_back(*k, make_error(ETIMEDOUT, "%s (raise CUDA_CRIU_STALL_TIMEOUT if the driver is "
								       "only slow)",
							    s->progress->stall_message(*k, now).c_str()));
			s->progress->observe(*k, {}, true, now); // given up: not reported again
		}
		return give_up;
	};
}

struct ActionResult {
	pid_t pid = 0;
	Status status;
	std::optional<CudaState> state_after;
};

// Runs plan on every pid at once, showing the progress of the copies (prefix: "cuda-criu: ").
// abandoned: set when a driver call was still running at its deadline or stalled (its worker thread
// cannot be stopped; the caller must not run static destructors under it).
std::vector<ActionResult> run_plan(Driver &d, const std::vector<pid_t> &pids, const Plan &plan, const Options &options,
				   const std::string &prefix, bool &abandoned)
{
	std::vector<std::shared_ptr<std::atomic<bool>>> finished;
	std::vector<std::shared_ptr<CopyState>> copies;
	std::vector<Job> jobs;
	for (pid_t pid : pids) {
		auto done = std::make_shared<std::atomic<bool>>(false);
		auto c = std::make_shared<CopyState>();
		finished.push_back(done);
		copies.push_back(c);
		Driver *driver = &d;
		jobs.push_back({format("%s pid %d", plan.action.c_str(), pid), [driver, pid, plan, done, c] {
					Status st = perform(*driver, pid, plan, *c);
					done->store(true);
					return st;
				}});
	}
	ProgressDisplay display;
	std::vector<Status> results = run_jobs(std::move(jobs), 0, plan.wait_ms,
					       watch_copies(&d, pids, copies, options.stall_timeout_ms, display, prefix));
	display.finish();
	abandoned = false;
	std::vector<ActionResult> out;
	for (size_t i = 0; i < pids.size(); i++) {
		ActionResult o;
		o.pid = pids[i];
		o.status = std::move(results[i]);
		if (!finished[i]->load()) {
			abandoned = true;
		} else if (auto s = d.state(pids[i])) {
			// A process stuck in the driver is not asked again: the question could hang as well.
			o.state_after = *s;
		}
		if (!o.status) {
			Error e = explain_process_error(o.pid, o.status.error());
			if (o.state_after)
				e = make_error(e.errno_value(), "%s (the process is now %s)", e.message().c_str(),
					       to_string(*o.state_after));
			o.status = std::move(e);
		}
		out.push_back(std::move(o));
	}
	return out;
}

// Ends the program; after an abandoned driver call without running static destructors.
[[noreturn]] void exit_program(int rc, bool abandoned)
{
	std::fflush(stdout);
	std::fflush(stderr);
	if (abandoned)
		_exit(rc);
	std::exit(rc);
}

// The wait for a whole job: its lock (the driver's timeout plus a grace) and its other steps.
unsigned job_limit(unsigned lock_ms, bool locks, unsigned other_ms, bool other)
{
	if ((locks && lock_ms == 0) || (other && other_ms == 0))
		return 0;
	return (locks ? lock_ms + kDriverGraceMs : 0) + (other ? other_ms : 0);
}

// Fills the timeouts of plan from an explicit --timeout (timeout_ms, if given) and the plugin's options.
void set_timeouts(Plan &plan, const Options &o, std::optional<unsigned> timeout_ms)
{
	const std::string &a = plan.action;
	plan.lock_timeout_ms = o.lock_timeout_ms;
	if (a == "lock") {
		plan.lock_timeout_ms = timeout_ms.value_or(o.lock_timeout_ms);
		plan.wait_ms = job_limit(plan.lock_timeout_ms, true, 0, false);
	} else if (a == "checkpoint") {
		plan.wait_ms = timeout_ms.value_or(o.checkpoint_timeout_ms);
	} else if (a == "restore" || a == "unlock" || a == "resume") {
		plan.wait_ms = timeout_ms.value_or(o.restore_timeout_ms);
	} else if (a == "suspend") {
		plan.lock_timeout_ms = timeout_ms.value_or(o.lock_timeout_ms);
		plan.wait_ms = job_limit(plan.lock_timeout_ms, true, o.checkpoint_timeout_ms, true);
	} else { // toggle
		plan.lock_timeout_ms = timeout_ms.value_or(o.lock_timeout_ms);
		plan.wait_ms = job_limit(plan.lock_timeout_ms, true,
					 std::max(o.checkpoint_timeout_ms, o.restore_timeout_ms), true);
	}
}

// The driver's GPUs, for GPU indices in --device-map.
Result<std::vector<GpuInfo>> driver_gpus()
{
	auto d = open_driver();
	if (!d)
		return std::move(d).error();
	return (*d)->gpus();
}

// --device-map TEXT as every pair the driver needs (core/gpu_plan.h: plan_live_device_map). A map that
// does not parse or does not fit this machine's GPUs is the user's error (*usage set); a driver that
// cannot list the GPUs is not.
Result<std::vector<GpuPair>> device_map_pairs(const std::string &text, bool *usage)
{
	*usage = true;
	auto map = DeviceMap::parse(text);
	if (!map)
		return std::move(map).error();
	auto here = driver_gpus();
	if (!here) {
		*usage = false;
		return std::move(here).error().context("%s", "list the GPUs for the device map");
	}
	return plan_live_device_map(*map, *here, SystemHost().machine_gpus());
}

// Shows what became of each process (a line each, errors on stderr; or one JSON object) and returns the
// exit status.
int show_outcomes(const std::vector<ActionResult> &outcomes, bool json)
{
	int rc = kExitOk;
	JsonWriter j;
	j.begin_object().key("processes").begin_array();
	for (const ActionResult &o : outcomes) {
		if (!o.status)
			rc = kExitFailure;
		j.begin_object().field("pid", o.pid).field("ok", o.status.ok());
		if (o.state_after)
			j.field("state", to_string(*o.state_after));
		else
			j.key("state").null();
		if (o.status)
			j.key("error").null();
		else
			j.field("error", o.status.error().message());
		j.end_object();
		if (json)
			continue;
		if (!o.status)
			std::fprintf(stderr, "cuda-criu: %s\n", o.status.error().message().c_str());
		else
			std::printf("%d %s\n", o.pid, o.state_after ? to_string(*o.state_after) : "unknown");
	}
	j.end_array().end_object();
	if (json)
		std::fputs(j.str().c_str(), stdout);
	return rc;
}

} // namespace

int cmd_action(const Invocation &in)
{
	const std::string action = in.command.name;
	const ParsedArgs &a = in.args;
	if (a.positionals.empty())
		return usage_error(action, "needs at least one process id");
	std::vector<pid_t> pids;
	for (const std::string &p : a.positionals) {
		auto pid = parse_pid(p);
		if (!pid)
			return usage_error(action, pid.error().message());
		pids.push_back(*pid);
	}
	std::optional<unsigned> timeout_ms;
	if (const std::string *t = a.value("--timeout")) {
		auto ms = parse_seconds(*t);
		if (!ms)
			return usage_error(action, "--timeout: " + ms.error().message());
		timeout_ms = *ms;
	}
	Plan plan;
	plan.action = action;
	if (const std::string *m = a.value("--device-map")) {
		bool usage = false;
		auto pairs = device_map_pairs(*m, &usage);
		if (!pairs)
			return usage ? usage_error(action, "--device-map: " + pairs.error().message())
				     : report_failure("--device-map: " + pairs.error().message());
		plan.pairs = std::move(*pairs);
	}
	auto options = load_options_from_environment();
	if (!options)
		return report_failure(options.error().message());
	set_timeouts(plan, *options, timeout_ms);

	auto d = open_driver();
	if (!d)
		return report_failure(d.error().message());
	bool abandoned = false;
	std::vector<ActionResult> outcomes = run_plan(**d, pids, plan, *options, "cuda-criu: ", abandoned);

	exit_program(show_outcomes(outcomes, a.has("--json")), abandoned);
}

namespace {

// What a cuda-checkpoint command line asks: one pid, and a driver action (plan) or one of the queries.
struct CompatRequest {
	enum class Query { None, State, RestoreTid } query = Query::None;
	pid_t pid = 0;
	Plan plan;
	std::optional<unsigned> timeout_ms;
};

// Parses cuda-checkpoint's options into r; returns the exit status when the command ends here (help, or
// a usage error or bad device map, already printed), nullopt when r is to be carried out.
std::optional<int> parse_compat(const std::string &program, const Args &args, CompatRequest &r)
{
	auto usage = [&](const std::string &msg) {
		std::fprintf(stderr, "%s: %s\nTry '%s --help'.\n", program.c_str(), msg.c_str(), program.c_str());
		return kExitUsage;
	};
	auto parsed = parse_args(args, find_command("compat")->options);
	if (!parsed)
		return usage(parsed.error().message());
	const ParsedArgs &a = *parsed;
	if (args.empty())
		return usage("no option given");
	if (a.has("--help")) {
		print_compat_help(program);
		return kExitOk;
	}
	if (!a.positionals.empty())
		return usage("unexpected argument '" + a.positionals[0] + "'");
	int modes = a.has("--action") + a.has("--get-state") + a.has("--get-restore-tid") + a.has("--toggle");
	if (modes != 1)
		return usage("give exactly one of --action, --toggle, --get-state and --get-restore-tid");
	const std::string *pid_text = a.value("--pid");
	if (!pid_text)
		return usage("--pid is required");
	auto pid = parse_pid(*pid_text);
	if (!pid)
		return usage("--pid: " + pid.error().message());
	r.pid = *pid;

	if (const std::string *act = a.value("--action")) {
		if (*act != "lock" && *act != "checkpoint" && *act != "restore" && *act != "unlock")
			return usage("--action '" + *act + "': expected lock, checkpoint, restore or unlock");
		r.plan.action = *act;
	} else if (a.has("--toggle")) {
		r.plan.action = "toggle";
	} else {
		r.query = a.has("--get-state") ? CompatRequest::Query::State : CompatRequest::Query::RestoreTid;
	}
	if (const std::string *t = a.value("--timeout")) {
		auto ms = parse_milliseconds(*t);
		if (!ms)
			return usage("--timeout: " + ms.error().message());
		r.timeout_ms = *ms;
	}
	if (const std::string *m = a.value("--device-map")) {
		if (r.plan.action != "restore" && r.plan.action != "toggle")
			return usage("--device-map goes with --action restore or --toggle");
		bool map_usage = false;
		auto pairs = device_map_pairs(*m, &map_usage);
		if (!pairs) {
			if (map_usage)
				return usage("--device-map: " + pairs.error().message());
			std::fprintf(stderr, "%s: --device-map: %s\n", program.c_str(), pairs.error().message().c_str());
			return kExitFailure;
		}
		r.plan.pairs = std::move(*pairs);
	}
	return std::nullopt;
}

} // namespace

int cmd_compat(const Invocation &in) { return cmd_compat("cuda-criu compat", in.args.positionals); }

int cmd_compat(const std::string &program, const Args &args)
{
	CompatRequest r;
	if (auto done = parse_compat(program, args, r))
		return *done;
	auto options = load_options_from_environment();
	if (!options) {
		std::fprintf(stderr, "%s: %s\n", program.c_str(), options.error().message().c_str());
		return kExitFailure;
	}
	auto d = open_driver();
	if (!d) {
		std::fprintf(stderr, "%s: %s\n", program.c_str(), d.error().message().c_str());
		return kExitFailure;
	}
	auto fail = [&](const char *what, const Error &e) {
		std::fprintf(stderr, "%s: %s pid %d: %s\n", program.c_str(), what, r.pid,
			     explain_process_error(r.pid, e).message().c_str());
		return kExitFailure;
	};
	if (r.query == CompatRequest::Query::State) {
		auto s = (*d)->state(r.pid);
		if (!s)
			return fail("get-state", s.error());
		std::printf("%s\n", to_string(*s));
		return kExitOk;
	}
	if (r.query == CompatRequest::Query::RestoreTid) {
		auto tid = (*d)->restore_thread_id(r.pid);
		if (!tid)
			return fail("get-restore-tid", tid.error());
		std::printf("%d\n", *tid);
		return kExitOk;
	}
	set_timeouts(r.plan, *options, r.timeout_ms);
	bool abandoned = false;
	std::vector<ActionResult> outcomes = run_plan(**d, {r.pid}, r.plan, *options, program + ": ", abandoned);
	int rc = kExitOk;
	if (!outcomes[0].status) {
		std::fprintf(stderr, "%s: %s\n", program.c_str(), outcomes[0].status.error().message().c_str());
		rc = kExitFailure;
	}
	exit_program(rc, abandoned);
}

} // namespace cuda_criu::cli
