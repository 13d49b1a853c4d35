#include "os/thread_run.h"

#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <utility>

#include "base/log.h"
#include "os/proc.h"

namespace cuda_criu {

Result<ThreadRun> ThreadRun::start(pid_t tid)
{
	auto status = read_task_status(tid);
	if (!status)
		return std::move(status).error().context("restore thread %d", tid);
	if (status->tracer != gettid())
		return ThreadRun(tid, 0, 0, false);

	// The options CRIU (compel) set when it seized the thread: TRACESYSGOOD, plus SUSPEND_SECCOMP for a
	// thread under seccomp.
	long options = PTRACE_O_TRACESYSGOOD | (status->seccomp ? PTRACE_O_SUSPEND_SECCOMP : 0);
	uint64_t mask = 0;
	if (ptrace(PTRACE_GETSIGMASK, tid, sizeof(mask), &mask) != 0)
		return errno_error("PTRACE_GETSIGMASK on restore thread %d", tid);

	uint64_t block = ~0ULL & ~(1ULL << (SIGTRAP - 1));
	if (ptrace(PTRACE_SETSIGMASK, tid, sizeof(block), &block) != 0)
		return errno_error("PTRACE_SETSIGMASK on restore thread %d", tid);
	ThreadRun run(tid, mask, options, true); // from here on, the destructor puts things back
	if (ptrace(PTRACE_SETOPTIONS, tid, nullptr, 0) != 0 || ptrace(PTRACE_CONT, tid, nullptr, 0) != 0) {
		Error err = errno_error("resume restore thread %d", tid);
		run.running_ = false; // not resumed: only the mask and options need putting back
		ptrace(PTRACE_SETSIGMASK, tid, sizeof(mask), &mask);
		ptrace(PTRACE_SETOPTIONS, tid, nullptr, options);
		return err;
	}
	return run;
}

ThreadRun::ThreadRun(ThreadRun &&other) noexcept
	: tid_(other.tid_), saved_mask_(other.saved_mask_), saved_options_(other.saved_options_),
	  running_(std::exchange(other.running_, false))
{
}

ThreadRun::~ThreadRun()
{
	if (running_)
		if (auto st = stop(); !st)
			LOG_ERROR("%s", st.error().message().c_str());
}

Status ThreadRun::stop()
{
	if (!running_)
		return {};
	running_ = false;
	if (ptrace(PTRACE_INTERRUPT, tid_, nullptr, 0) != 0)
		return errno_error("PTRACE_INTERRUPT on restore thread %d", tid_);
	for (;;) {
		int status = 0;
		pid_t r = waitpid(tid_, &status, __WALL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return errno_error("wait for restore thread %d to stop", tid_);
		}
		if (WIFEXITED(status) || WIFSIGNALED(status))
			return make_error(ESRCH, "restore thread %d exited while it ran (%s %d)", tid_,
					  WIFEXITED(status) ? "exit code" : "signal",
					  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		if (!WIFSTOPPED(status))
			continue;
		if ((status >> 16) == PTRACE_EVENT_STOP)
			break; // the interrupt (or a group stop) took hold
		// A signal-delivery stop: hand the signal back and wait for the interrupt.
		if (ptrace(PTRACE_CONT, tid_, nullptr, WSTOPSIG(status)) != 0)
			return errno_error("continue restore thread %d after signal %d", tid_, WSTOPSIG(status));
	}
	// The mask first: a thread left with every signal blocked is worse than one with CRIU's ptrace
	// options lost, and a failure of one must not skip the other.
	Status mask;
	if (ptrace(PTRACE_SETSIGMASK, tid_, sizeof(saved_mask_), &saved_mask_) != 0)
		mask = errno_error("put back the signal mask of restore thread %d", tid_);
	if (ptrace(PTRACE_SETOPTIONS, tid_, nullptr, saved_options_) != 0)
		return errno_error("put back ptrace options of restore thread %d", tid_);
	return mask;
}

} // namespace cuda_criu
