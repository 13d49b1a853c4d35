// lock, checkpoint, restore, unlock, suspend, resume, and the cuda-checkpoint compatible command line.
// Every process is driven on its own worker (core/parallel.h), so that one that hangs in the driver does
// not hold up the others and the wait for it can be bounded.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>

#include "cli.h"
#include "core/gpu_plan.h"
#include "core/options.h"
#include "core/parallel.h"
#include "json.h"
#include "os/host.h"
#include "process_errors.h"

namespace cuda_criu::cli {
namespace {

struct Plan {
	std::string action;          // lock, checkpoint, restore, unlock, suspend, resume, toggle
	unsigned lock_timeout_ms = 0; // passed to the driver's lock (0: no limit)
	unsigned wait_ms = 0;         // how long to wait for a process's whole job (0: no limit)
	std::vector<GpuPair> pairs;   // for restore
};

Status lock_then_checkpoint(Driver &d, pid_t pid, const Plan &plan, bool locked)
{
	if (!locked)
		if (auto st = d.lock(pid, plan.lock_timeout_ms); !st)
			return std::move(st).error().context("lock");
	if (auto st = d.checkpoint(pid); !st)
		return std::move(st).error().context("checkpoint");
	return {};
}

Status restore_then_unlock(Driver &d, pid_t pid, const Plan &plan, bool checkpointed)
{
	if (checkpointed)
		if (auto st = d.restore(pid, plan.pairs); !st)
			return std::move(st).error().context("restore");
	if (auto st = d.unlock(pid); !st)
		return std::move(st).error().context("unlock");
	return {};
}

Status perform(Driver &d, pid_t pid, const Plan &plan)
{
	if (plan.action == "lock")
		return d.lock(pid, plan.lock_timeout_ms);
	if (plan.action == "checkpoint")
		return d.checkpoint(pid);
	if (plan.action == "restore")
		return d.restore(pid, plan.pairs);
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
		return lock_then_checkpoint(d, pid, plan, *state == CudaState::Locked);
	}
	if (plan.action == "resume") {
		if (*state == CudaState::Running)
			return {};
		return restore_then_unlock(d, pid, plan, *state == CudaState::Checkpointed);
	}
	// toggle: between running and checkpointed only, as cuda-checkpoint does.
	if (*state == CudaState::Running)
		return lock_then_checkpoint(d, pid, plan, false);
	if (*state == CudaState::Checkpointed)
		return restore_then_unlock(d, pid, plan, true);
	return make_error(EINVAL, "the process is locked: --toggle goes between running and checkpointed only; use "
				  "--action checkpoint or --action unlock");
}

struct ActionResult {
	pid_t pid = 0;
	Status status;
	std::optional<CudaState> state_after;
};

// Runs plan on every pid at once. abandoned: set when a driver call was still running at its deadline
// (its worker thread cannot be stopped; the caller must not run static destructors under it).
std::vector<ActionResult> run_plan(Driver &d, const std::vector<pid_t> &pids, const Plan &plan, bool &abandoned)
{
	std::vector<std::shared_ptr<std::atomic<bool>>> finished;
	std::vector<Job> jobs;
	for (pid_t pid : pids) {
		auto done = std::make_shared<std::atomic<bool>>(false);
		finished.push_back(done);
		Driver *driver = &d;
		jobs.push_back({format("%s pid %d", plan.action.c_str(), pid), [driver, pid, plan, done] {
					Status st = perform(*driver, pid, plan);
					done->store(true);
					return st;
				}});
	}
	std::vector<Status> results = run_jobs(std::move(jobs), 0, plan.wait_ms);
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

} // namespace

int cmd_action(const std::string &action, const Args &args)
{
	std::vector<OptionSpec> specs = {{"--timeout", true, nullptr}, {"--json", false, nullptr}};
	bool maps_devices = action == "restore" || action == "resume";
	if (maps_devices)
		specs.push_back({"--device-map", true, nullptr});
	ParsedArgs a;
	if (auto rc = parse_command(action, args, specs, a))
		return *rc;
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
	std::vector<ActionResult> outcomes = run_plan(**d, pids, plan, abandoned);

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
		if (a.has("--json"))
			continue;
		if (!o.status)
			std::fprintf(stderr, "cuda-criu: %s\n", o.status.error().message().c_str());
		else
			std::printf("%d %s\n", o.pid, o.state_after ? to_string(*o.state_after) : "unknown");
	}
	j.end_array().end_object();
	if (a.has("--json"))
		std::fputs(j.str().c_str(), stdout);
	exit_program(rc, abandoned);
}

int cmd_compat(const std::string &program, const Args &args)
{
	auto usage = [&](const std::string &msg) {
		std::fprintf(stderr, "%s: %s\nTry '%s --help'.\n", program.c_str(), msg.c_str(), program.c_str());
		return kExitUsage;
	};
	auto parsed = parse_args(args, {{"--action", true, nullptr},
					{"--pid", true, "-p"},
					{"--timeout", true, nullptr},
					{"--device-map", true, nullptr},
					{"--get-state", false, nullptr},
					{"--get-restore-tid", false, nullptr},
					{"--toggle", false, nullptr}});
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

	Plan plan;
	if (const std::string *act = a.value("--action")) {
		if (*act != "lock" && *act != "checkpoint" && *act != "restore" && *act != "unlock")
			return usage("--action '" + *act + "': expected lock, checkpoint, restore or unlock");
		plan.action = *act;
	} else if (a.has("--toggle")) {
		plan.action = "toggle";
	}
	std::optional<unsigned> timeout_ms;
	if (const std::string *t = a.value("--timeout")) {
		auto ms = parse_milliseconds(*t);
		if (!ms)
			return usage("--timeout: " + ms.error().message());
		timeout_ms = *ms;
	}
	if (const std::string *m = a.value("--device-map")) {
		if (plan.action != "restore" && plan.action != "toggle")
			return usage("--device-map goes with --action restore or --toggle");
		bool map_usage = false;
		auto pairs = device_map_pairs(*m, &map_usage);
		if (!pairs) {
			if (map_usage)
				return usage("--device-map: " + pairs.error().message());
			std::fprintf(stderr, "%s: --device-map: %s\n", program.c_str(), pairs.error().message().c_str());
			return kExitFailure;
		}
		plan.pairs = std::move(*pairs);
	}
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
		std::fprintf(stderr, "%s: %s pid %d: %s\n", program.c_str(), what, *pid,
			     explain_process_error(*pid, e).message().c_str());
		return kExitFailure;
	};
	if (a.has("--get-state")) {
		auto s = (*d)->state(*pid);
		if (!s)
			return fail("get-state", s.error());
		std::printf("%s\n", to_string(*s));
		return kExitOk;
	}
	if (a.has("--get-restore-tid")) {
		auto tid = (*d)->restore_thread_id(*pid);
		if (!tid)
			return fail("get-restore-tid", tid.error());
		std::printf("%d\n", *tid);
		return kExitOk;
	}
	set_timeouts(plan, *options, timeout_ms);
	bool abandoned = false;
	std::vector<ActionResult> outcomes = run_plan(**d, {*pid}, plan, abandoned);
	int rc = kExitOk;
	if (!outcomes[0].status) {
		std::fprintf(stderr, "%s: %s\n", program.c_str(), outcomes[0].status.error().message().c_str());
		rc = kExitFailure;
	}
	exit_program(rc, abandoned);
}

} // namespace cuda_criu::cli
