// lock, checkpoint, restore, unlock, suspend, resume, and the cuda-checkpoint compatible command line.
// The processes are driven on core's job machinery (core/driver_calls.h: run_proc_jobs, one worker per
// process, so that one that hangs in the driver does not hold up the others and the wait for it is
// bounded), one step of the state machine at a time for all of them. While a checkpoint or restore
// copies, a progress line shows on stderr (core/progress.h, as the plugin's in CRIU's log), and a copy
// that stops making progress is given up after the stall timeout.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "base/clock.h"
#include "cli.h"
#include "commands.h"
#include "core/driver_calls.h"
#include "core/dump_refusals.h"
#include "core/gpu_plan.h"
#include "core/options.h"
#include "json.h"
#include "os/host.h"
#include "os/proc.h"
#include "process_errors.h"
#include "progress_display.h"

namespace cuda_criu::cli {
namespace {

struct Plan {
	std::string action;           // lock, checkpoint, restore, unlock, suspend, resume, toggle
	unsigned lock_timeout_ms = 0; // passed to the driver's lock (0: no limit)
	unsigned checkpoint_ms = 0;   // the wait for a checkpoint (0: no limit)
	unsigned restore_ms = 0;      // the wait for a restore or an unlock (0: no limit)
	std::vector<GpuPair> pairs;   // for restore
};

// Fills the timeouts of plan from the plugin's options and an explicit --timeout (timeout_ms, if given):
// the lock timeout of lock, suspend and toggle, else the wait for the step the action is about.
void set_timeouts(Plan &plan, const Options &o, std::optional<unsigned> timeout_ms)
{
	plan.lock_timeout_ms = o.lock_timeout_ms;
	plan.checkpoint_ms = o.checkpoint_timeout_ms;
	plan.restore_ms = o.restore_timeout_ms;
	if (!timeout_ms)
		return;
	const std::string &a = plan.action;
	if (a == "lock" || a == "suspend" || a == "toggle")
		plan.lock_timeout_ms = *timeout_ms;
	else if (a == "checkpoint")
		plan.checkpoint_ms = *timeout_ms;
	else
		plan.restore_ms = *timeout_ms;
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

struct ActionResult {
	pid_t pid = 0;
	Status status;
	std::optional<CudaState> state_after;
	pid_t restore_tid = 0;          // 0: unknown (the stall is then told by the bytes alone)
	std::optional<CudaState> state; // before the plan, for suspend, resume and toggle
	bool returned = true;           // false: a driver call was still running at its deadline, or stalled
};

// Runs a plan, one step for all its processes at a time.
class ActionRun {
public:
	ActionRun(Driver &d, const Plan &plan, const Options &options, std::string prefix)
		: driver_(&d), shared_(std::make_shared<TimedDriver>(d)), plan_(plan), options_(options),
		  prefix_(std::move(prefix))
	{
	}

	std::vector<ActionResult> run(const std::vector<pid_t> &pids);

private:
	using Call = std::function<Status(Driver &, pid_t)>;
	// step: call on the processes that pick chooses (and that have not failed), within wait_ms (0: no
	// limit); context: what the error says failed, in an action of several steps; copy: the phase
	// whose progress shows ("checkpoint", "restore"), or nullptr.
	void step(const std::function<bool(const ActionResult &)> &pick, unsigned wait_ms, const char *context,
		  const char *copy, const Call &call);
	PhaseProgress progress(const char *copy, const std::vector<pid_t> &pids);

	Driver *driver_;
	SharedDriver shared_;
	SystemHost host_;
	const Plan &plan_;
	const Options &options_;
	std::string prefix_;
	ProgressDisplay display_;
	std::vector<ActionResult> results_;
	bool nvml_ = true;
};

// The progress of a copy, sampled as the plugin samples it: a checkpoint's bytes are the growth of each
// process's memory since it began, of the GPU memory NVML reported then; a restore's its GPU memory
// again, of a total nobody here knows (and may stay 0 until it is done: no stall on CPU time alone).
PhaseProgress ActionRun::progress(const char *copy, const std::vector<pid_t> &pids)
{
	PhaseProgress pp;
	pp.phase = copy;
	pp.stall_ms = options_.stall_timeout_ms;
	pp.every_ms = display_.in_place() ? 1000 : 3000;
	pp.show = [this](const std::string &line) { display_.show(prefix_ + line); };
	if (pp.phase == "checkpoint") {
		std::map<pid_t, uint64_t> gpu = gpu_bytes(driver_, nvml_);
		std::vector<uint64_t> before;
		for (pid_t pid : pids) {
			pp.expected.push_back(gpu.count(pid) ? gpu[pid] : 0);
			auto st = read_task_status(pid);
			before.push_back(st ? st->rss_bytes : 0);
		}
		pp.bytes = [pids, before](size_t k) -> uint64_t {
			auto st = read_task_status(pids[k]);
			return st && st->rss_bytes > before[k] ? st->rss_bytes - before[k] : 0;
		};
		return pp;
	}
	pp.stall_needs_bytes = true;
	// One NVML look serves every process of a round of samples.
	struct Sampled {
		std::map<pid_t, uint64_t> gpu;
		uint64_t at_us = 0;
	};
	pp.bytes = [this, pids, s = std::make_shared<Sampled>()](size_t k) -> uint64_t {
		if (now_us() - s->at_us > 250000) {
			s->gpu = gpu_bytes(driver_, nvml_);
			s->at_us = now_us();
		}
		auto it = s->gpu.find(pids[k]);
		return it == s->gpu.end() ? 0 : it->second;
	};
	return pp;
}

void ActionRun::step(const std::function<bool(const ActionResult &)> &pick, unsigned wait_ms, const char *context,
		     const char *copy, const Call &call)
{
	std::vector<ProcJob> jobs;
	std::vector<size_t> index;
	std::vector<pid_t> pids;
	for (size_t i = 0; i < results_.size(); i++) {
		const ActionResult &r = results_[i];
		if (!r.status || !pick(r))
			continue;
		jobs.push_back({r.pid, r.restore_tid, format("%s pid %d", plan_.action.c_str(), r.pid),
				[call, pid = r.pid, context](Driver &d) {
					Status st = call(d, pid);
					return st || !context ? st : std::move(st).error().context("%s", context);
				},
				false});
		index.push_back(i);
		pids.push_back(r.pid);
	}
	if (jobs.empty())
		return;
	PhaseProgress pp;
	if (copy)
		pp = progress(copy, pids);
	std::vector<ProcResult> out = run_proc_jobs(host_, shared_, std::move(jobs), 0, wait_ms, copy ? &pp : nullptr);
	display_.finish();
	for (size_t k = 0; k < index.size(); k++) {
		ActionResult &r = results_[index[k]];
		r.status = std::move(out[k].status);
		r.returned = r.status || out[k].us;
	}
}

std::vector<ActionResult> ActionRun::run(const std::vector<pid_t> &pids)
{
	for (pid_t pid : pids) {
		results_.emplace_back();
		results_.back().pid = pid;
	}
	const std::string &a = plan_.action;
	const bool composite = a == "suspend" || a == "resume" || a == "toggle";
	// Before the steps: each process's restore thread (for the stall's CPU time) and, for an action that
	// depends on it, its state; slots shared with calls that may be abandoned.
	if (a != "lock" && a != "unlock") {
		std::map<pid_t, std::shared_ptr<std::pair<pid_t, std::optional<CudaState>>>> seen;
		for (pid_t pid : pids)
			seen[pid] = std::make_shared<std::pair<pid_t, std::optional<CudaState>>>();
		step([](const ActionResult &) { return true; }, kDriverGraceMs, nullptr, nullptr,
		     [seen, composite](Driver &d, pid_t pid) -> Status {
			     if (auto tid = d.restore_thread_id(pid))
				     seen.at(pid)->first = *tid;
			     if (!composite)
				     return {};
			     auto state = d.state(pid);
			     if (!state)
				     return std::move(state).error();
			     seen.at(pid)->second = *state;
			     return {};
		     });
		for (ActionResult &r : results_) {
			r.restore_tid = seen[r.pid]->first;
			r.state = seen[r.pid]->second;
		}
	}
	auto is = [](std::initializer_list<CudaState> states) {
		return [states](const ActionResult &r) {
			return !r.state || std::find(states.begin(), states.end(), *r.state) != states.end();
		};
	};
	Call lock = [lock_ms = plan_.lock_timeout_ms](Driver &d, pid_t pid) { return d.lock(pid, lock_ms); };
	Call checkpoint = [](Driver &d, pid_t pid) { return d.checkpoint(pid); };
	Call restore = [pairs = plan_.pairs](Driver &d, pid_t pid) { return d.restore(pid, pairs); };
	Call unlock = [](Driver &d, pid_t pid) { return d.unlock(pid); };
	const unsigned lock_wait = plan_.lock_timeout_ms ? plan_.lock_timeout_ms + kDriverGraceMs : 0;
	for (ActionResult &r : results_) {
		Status refused;
		if (r.status && r.state == CudaState::Failed)
			refused = make_error(EIO, "the driver reports the process's CUDA state as failed: it cannot be %s",
					     a == "suspend" ? "checkpointed" : "brought back");
		else if (r.status && a == "toggle" && r.state == CudaState::Locked)
			refused = make_error(EINVAL, "the process is locked: --toggle goes between running and checkpointed "
						     "only; use --action checkpoint or --action unlock");
		// What a dump refuses before its lock, a checkpoint here refuses too: the image would not restore.
		else if (r.status && (a == "checkpoint" || a == "suspend" || a == "toggle") &&
			 r.state != CudaState::Checkpointed)
			refused = refuse_sharing(host_, r.pid);
		if (!refused)
			r.status = std::move(refused).error().context("%s pid %d", a.c_str(), r.pid);
	}
	const bool down = a == "lock" || a == "checkpoint" || a == "suspend" || a == "toggle";
	const bool up = a == "restore" || a == "unlock" || a == "resume" || a == "toggle";
	if (down) {
		if (a != "checkpoint")
			step(a == "lock" ? is({}) : is({CudaState::Running}), lock_wait, composite ? "lock" : nullptr, nullptr,
			     lock);
		if (a != "lock")
			step(a == "checkpoint" ? is({}) : is({CudaState::Running, CudaState::Locked}), plan_.checkpoint_ms,
			     composite ? "checkpoint" : nullptr, "checkpoint", checkpoint);
	}
	if (up) {
		if (a != "unlock")
			step(a == "restore" ? is({}) : is({CudaState::Checkpointed}), plan_.restore_ms,
			     composite ? "restore" : nullptr, "restore", restore);
		if (a != "restore")
			step(a == "unlock" ? is({}) : a == "toggle" ? is({CudaState::Checkpointed})
								  : is({CudaState::Checkpointed, CudaState::Locked}),
			     plan_.restore_ms, composite ? "unlock" : nullptr, nullptr, unlock);
	}
	for (ActionResult &r : results_) {
		// A process stuck in the driver is not asked again: the question could hang as well.
		if (r.returned)
			if (auto s = driver_->state(r.pid))
				r.state_after = *s;
		if (!r.status) {
			Error e = explain_process_error(r.pid, r.status.error());
			if (r.state_after)
				e = make_error(e.errno_value(), "%s (the process is now %s)", e.message().c_str(),
					       to_string(*r.state_after));
			r.status = std::move(e);
		}
	}
	return std::move(results_);
}

// suspend and resume take each process from its state to theirs, so a step of theirs is refused in the
// process's state (CUDA_ERROR_ILLEGAL_STATE) only where another caller acts on it at the same time: the
// dump guard returning a process that a failed dump left behind, while the dump's log tells the user to
// run cuda-criu resume, or a second cuda-criu. Such a process, if it still answers a state query with a
// state other than failed, is taken again from its state then, every 100 ms for up to kConcurrentRetryMs.
constexpr uint64_t kConcurrentRetryMs = 10000;

// Runs plan on every pid at once, showing the progress of the copies (prefix: "cuda-criu: ").
// abandoned: set when a driver call was still running at its deadline or stalled (its worker thread
// cannot be stopped; the caller must not run static destructors under it).
std::vector<ActionResult> run_plan(Driver &d, const std::vector<pid_t> &pids, const Plan &plan, const Options &options,
				   const std::string &prefix, bool &abandoned)
{
	std::vector<ActionResult> out = ActionRun(d, plan, options, prefix).run(pids);
	const bool from_state = plan.action == "suspend" || plan.action == "resume";
	for (const uint64_t end = now_us() + kConcurrentRetryMs * 1000; from_state && now_us() < end;) {
		std::vector<size_t> again;
		std::vector<pid_t> pids_again;
		for (size_t i = 0; i < out.size(); i++) {
			const ActionResult &r = out[i];
			if (!r.status && r.status.error().errno_value() == kWrongState && r.returned && r.state_after &&
			    *r.state_after != CudaState::Failed) {
				again.push_back(i);
				pids_again.push_back(r.pid);
			}
		}
		if (again.empty())
			break;
		std::this_thread::sleep_for(std::chrono::milliseconds(100));
		std::vector<ActionResult> more = ActionRun(d, plan, options, prefix).run(pids_again);
		for (size_t k = 0; k < again.size(); k++)
			out[again[k]] = std::move(more[k]);
	}
	abandoned = std::any_of(out.begin(), out.end(), [](const ActionResult &r) { return !r.returned; });
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
	Json processes = Json::array();
	for (const ActionResult &o : outcomes) {
		if (!o.status)
			rc = kExitFailure;
		processes.push_back(Json{{"pid", o.pid},
					 {"ok", o.status.ok()},
					 {"state", o.state_after ? Json(to_string(*o.state_after)) : Json()},
					 {"error", o.status ? Json() : Json(o.status.error().message())}});
		if (json)
			continue;
		if (!o.status)
			std::fprintf(stderr, "cuda-criu: %s\n", o.status.error().message().c_str());
		else
			std::printf("%d %s\n", o.pid, o.state_after ? to_string(*o.state_after) : "unknown");
	}
	if (json)
		std::fputs(json_text(Json{{"processes", processes}}).c_str(), stdout);
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
	auto parsed = parse_args(args, options_of(*find_command("compat")));
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
