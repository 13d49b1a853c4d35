// The guards: small processes that outlive CRIU, each forked from it (as a grandchild, reparented away)
// while CRIU has no threads of ours or of libcuda.
//
// The dump guard: once CRIU has exited, every CUDA process of the dump that is still alive must be in the
// state it was found in: after a normal dump it is dead, after --leave-running or a failed dump the plugin
// returned it. If not (CRIU died mid-dump, or CRIU let the tasks go after a successful dump because a
// post-dump script asked), the guard returns it there and says so in syslog.
//
// The restore guard: every CUDA process whose GPU state is being restored must end fully restored and
// unlocked, or dead. If CRIU exits (or the plugin finishes) before saying that a process is, the guard
// SIGKILLs it, so that no process runs without its GPU state, and says so in syslog.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>

#include "base/result.h"
#include "driver/driver.h"
#include "os/unique_fd.h"

namespace cuda_criu {

class DumpGuard {
public:
	// Must run before libcuda is loaded into this process: the guard is forked from it and loads its own
	// copy of the driver (calls driver) only if it has to act. timeout_ms: how long the guard waits for the
	// driver to return one process (0: no limit).
	static Result<DumpGuard> start(DriverSource driver, unsigned timeout_ms);

	DumpGuard() = default;
	// Tells the guard about a process about to be locked, and the state it was found in.
	void watch(pid_t pid, CudaState found);
	// That process is back in that state (the plugin returned it): the guard leaves it alone, even if
	// CRIU leaves it stopped (--leave-stopped), where a state query would wait for its restore thread.
	void returned(pid_t pid);

private:
	explicit DumpGuard(UniqueFd pipe) : pipe_(std::move(pipe)) {}
	UniqueFd pipe_;
};

// What the dump guard found and did for one process.
struct ReturnOutcome {
	CudaState left = CudaState::Running; // the state CRIU left it in: the first the guard saw
	CudaState now = CudaState::Running;  // its state when the guard was done
	bool acted = false; // a restore or unlock of the guard's succeeded
};

// The dump guard's work on one process it finds alive after CRIU exited: returns it to the state it was
// found in (restore and/or unlock). A driver call that CRIU made for it may still be in progress (CRIU
// died in the middle of it, or gave up on a call that stalled): the driver refuses another call until
// that one ends, and the state moves on, so each failed step is tried again, from the state then, every
// pause_ms until the call has ended or timeout_ms (at least 50 tries) has passed; a process that gets
// back by that call alone is not acted on. A state the guard cannot bring back to the one found (running
// or failed where it was found locked, failed where it was found running) is left as it is: now then
// differs from found. gone: whether the process has exited; then nothing is touched and the outcome is
// found, found, not acted.
Result<ReturnOutcome> return_to_found(Driver &d, pid_t pid, CudaState found, const std::function<bool()> &gone,
				      unsigned timeout_ms, unsigned pause_ms = 100);

class RestoreGuard {
public:
	// Must run while CRIU has no threads, before it forks the restored tasks (they close the inherited
	// socket with the rest of CRIU's files).
	static Result<RestoreGuard> start();

	RestoreGuard() = default;
	// A process whose GPU state is about to be restored.
	void restoring(pid_t pid);
	// That process is restored and unlocked: the guard leaves it alone.
	void restored(pid_t pid);

private:
	explicit RestoreGuard(UniqueFd pipe) : pipe_(std::move(pipe)) {}
	void send_line(char kind, pid_t pid);
	UniqueFd pipe_;
};

} // namespace cuda_criu
