// What the dump and restore sessions share: driver calls with a deadline, one job per process run with its
// restore thread let run, and the timing of a phase.
//
// Ownership: a driver call that outlives its deadline is abandoned, not cancelled; its thread runs on
// after the hook returned and after the session is gone. Such a call may touch only what it shares:
// the TimedDriver (shared_ptr), whose inner driver is loaded once and never unloaded (LibCuda), and its
// own result slot (shared_ptr). Nothing of the session is captured by pointer or reference.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "core/options.h"
#include "core/parallel.h"
#include "core/timed_driver.h"
#include "os/host.h"

namespace cuda_criu {

// kDriverGraceMs (core/options.h): how long a state query (or another call without a timeout of its own)
// may take before we stop waiting for it; also the grace past a driver call's own timeout.

// Loading libcuda and cuInit: seconds on a machine with many GPUs; minutes means it is wedged.
inline constexpr unsigned kDriverLoadTimeoutMs = 60000;

using SharedDriver = std::shared_ptr<TimedDriver>;

// Runs call on a worker and waits for it at most timeout_ms (0: no limit). what names the call and the
// pid ("query the CUDA state of pid 7"); a wedged call fails with ETIMEDOUT under that name (the call's
// own errors come back as they are). call must capture only what it owns or shares.
template <typename T>
Result<T> call_within(unsigned timeout_ms, const std::string &what, std::function<Result<T>()> call)
{
	auto slot = std::make_shared<std::optional<Result<T>>>(); // shared: an abandoned call writes it late
	std::vector<Job> job;
	job.push_back({what, [slot, call = std::move(call)]() -> Status {
			       *slot = call();
			       return {};
		       }});
	Status st = std::move(run_jobs(std::move(job), 1, timeout_ms)[0]);
	if (!st)
		return std::move(st).error();
	return std::move(**slot);
}

// call_within for one call of the driver, which the worker holds a share of.
template <typename T>
Result<T> ask(const SharedDriver &driver, unsigned timeout_ms, const std::string &what,
	      std::function<Result<T>(Driver &)> call)
{
	return call_within<T>(timeout_ms, what, [driver, call = std::move(call)] { return call(*driver); });
}

// One driver operation on one process, run while its restore thread is let run.
struct ProcJob {
	pid_t pid = 0;
	pid_t restore_tid = 0;
	std::string what;                        // "checkpoint pid 7"
	std::function<Status(Driver &)> call;    // captures nothing of the session
	// The restore thread is ptrace-stopped by this process (CRIU's tasks) and is let run for the call; a
	// process that runs on its own (cuda-criu's) has nothing to let run.
	bool stopped = true;
	// For a checkpoint: the restore thread traced and the driver's buffer prepared (os/checkpoint_buffer.h).
	std::optional<BufferPolicy> buffer = std::nullopt;
};

struct ProcResult {
	Status status; // how the job went: the driver call's result, a thread that could not be let run, a timeout
	uint64_t us = 0; // how long the call took (0 when it never finished)
	// After a failed call: the process's CUDA state, asked while its restore thread still ran (the driver
	// answers a state query through that thread; once it is stopped again the query would block).
	std::optional<CudaState> state_after_failure;
	BufferReport buffer; // what was done with the driver's buffer (ProcJob::buffer)
	// The restore thread let run for the call could not be stopped again, or its signal mask and ptrace
	// options not put back (it exited, or was not in a stop): a fault of its own, whatever the call did
	// (status is still the call's), named with the thread and logged by run_proc_jobs. The process's
	// threads are then not all stopped as CRIU had them.
	std::optional<Error> thread_error;
};

// Progress of the jobs' phase: expected bytes per job, sampled while they run (see core/progress.h).
struct PhaseProgress {
	std::string phase;                                      // "checkpoint", "restore"
	std::vector<uint64_t> expected;                         // per job, 0 = unknown
	std::function<uint64_t(size_t job)> bytes;              // what job i has copied so far
	unsigned stall_ms = 0;                                  // 0: no stall detection
	unsigned every_ms = 3000;                               // a progress line this often
	bool stall_needs_bytes = false;                         // see Progress
	std::function<void(const std::string &line)> show = {}; // where the lines go (default: the log)
};

// Lets each job's restore thread run (on the calling thread, the tracer), runs the jobs on workers with
// at most parallel at once, each limited to timeout_ms, then stops the threads again, whatever happened.
// A thread that cannot be let run fails its job; one that cannot be stopped again is reported apart from
// the call (ProcResult::thread_error). With progress: logs progress lines and gives up a job whose copy
// stalls.
std::vector<ProcResult> run_proc_jobs(Host &host, const SharedDriver &driver, std::vector<ProcJob> jobs,
				      unsigned parallel, unsigned timeout_ms, const PhaseProgress *progress = nullptr);

// Time the plugin spent in one phase (one hook kind), and how much of it the driver's calls covered.
struct PhaseCost {
	uint64_t wall_us = 0;
	uint64_t driver_us = 0;
	uint64_t load_us = 0; // loading libcuda and cuInit, the driver's too
	unsigned processes = 0;
	// "0.21 ms/process" of the plugin's own time.
	std::string per_process() const;
};

// Started at a hook's entry; charge() adds the time since then to a phase's cost.
class PhaseClock {
public:
	PhaseClock() : t0_(now_us()) {}
	void charge(PhaseCost &cost, const TimedDriver *driver, unsigned processes) const;

private:
	uint64_t t0_;
};

std::string seconds(uint64_t us);

} // namespace cuda_criu
