// Lets the driver's restore thread run while CRIU keeps every other thread of its process stopped.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "base/result.h"

namespace cuda_criu {

// A running spell of one ptrace-stopped thread. start() blocks every signal of the thread (but SIGTRAP),
// clears its ptrace options and resumes it; stop() interrupts it, waits for the stop and puts its signal
// mask and ptrace options back. Both must run on the thread that traces it (CRIU's main thread).
// A thread that is not traced by the caller (its process runs freely, e.g. during rollback after CRIU
// let the tasks go) needs nothing: start() returns an inactive run whose stop() does nothing.
class ThreadRun {
public:
	static Result<ThreadRun> start(pid_t tid);

	ThreadRun(ThreadRun &&other) noexcept;
	ThreadRun &operator=(ThreadRun &&) = delete;
	ThreadRun(const ThreadRun &) = delete;
	~ThreadRun(); // stops a thread still running, logging failures

	Status stop();
	bool active() const { return running_; }

private:
	ThreadRun(pid_t tid, uint64_t mask, long options, bool running)
		: tid_(tid), saved_mask_(mask), saved_options_(options), running_(running) {}

	pid_t tid_;
	uint64_t saved_mask_;
	long saved_options_;
	bool running_;
};

} // namespace cuda_criu
