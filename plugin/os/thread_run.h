// Lets the driver's restore thread run while CRIU keeps every other thread of its process stopped.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

#include "base/result.h"
#include "os/checkpoint_buffer.h"

namespace cuda_criu {

// A running spell of one ptrace-stopped thread. start() blocks every signal of the thread (but SIGTRAP),
// clears its ptrace options and resumes it; stop() interrupts it, waits for the stop and puts its signal
// mask and ptrace options back. All must run on the thread that traces it (CRIU's main thread).
// A thread that is not traced by the caller (its process runs freely, e.g. during rollback after CRIU
// let the tasks go) needs nothing: start() returns an inactive run whose stop() does nothing.
//
// With a BufferPolicy the thread runs with its system calls traced (PTRACE_SYSCALL), for the driver's
// checkpoint buffer (os/checkpoint_buffer.h). tend() must be called often while it runs: each stop of the
// thread waits for it. A stop signal (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU) pending for the process (CRIU
// queues one before the restore's device hook for --leave-stopped, or for a task dumped stopped) is
// taken by the restore thread, the only one that runs: it is held back, so that the driver's call goes
// on, and queued again for the process at stop(), so that the process stops once CRIU lets it go.
class ThreadRun {
public:
	static Result<ThreadRun> start(pid_t tid, std::optional<BufferPolicy> buffer = std::nullopt);

	ThreadRun(ThreadRun &&other) noexcept;
	ThreadRun &operator=(ThreadRun &&) = delete;
	ThreadRun(const ThreadRun &) = delete;
	~ThreadRun(); // stops a thread still running, logging failures

	// Handles the stops the thread has made since the last call, without waiting; whether there were any.
	bool tend();
	Status stop();
	bool active() const { return running_; }
	const BufferReport &buffer_report() const { return report_; }

private:
	ThreadRun(pid_t tid, pid_t tgid, uint64_t mask, long options, bool running)
		: tid_(tid), tgid_(tgid), saved_mask_(mask), saved_options_(options), running_(running) {}

	void on_syscall_stop();
	int signal_to_deliver(int stop_status);
	void prepare_buffer(uint64_t addr, uint64_t len);

	pid_t tid_;
	pid_t tgid_;
	uint64_t saved_mask_;
	long saved_options_;
	bool running_;
	std::optional<BufferPolicy> policy_; // set: system calls traced
	std::optional<int> ended_;           // wait status of a thread that exited while it ran
	uint64_t pending_len_ = 0;           // the buffer request the thread is in, MAP_POPULATE taken out
	long entry_nr_ = -1;                 // the system call of the last entry stop
	BufferReport report_;
	int held_stop_ = 0; // a stop signal the thread took while it ran, queued again at stop()
};

} // namespace cuda_criu
