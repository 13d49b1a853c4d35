#include "os/thread_run.h"

#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <utility>

#include "base/clock.h"
#include "base/format.h"
#include "base/log.h"
#include "os/proc.h"
#include "os/thp.h"

namespace cuda_criu {
namespace {

constexpr int kSyscallStop = SIGTRAP | 0x80; // with PTRACE_O_TRACESYSGOOD

bool is_syscall_stop(int status) { return WIFSTOPPED(status) && WSTOPSIG(status) == kSyscallStop; }
bool is_event_stop(int status) { return WIFSTOPPED(status) && (status >> 16) == PTRACE_EVENT_STOP; }

// Waits (blocking) for the next stop of tid, which is about to make one.
Result<int> wait_stop(pid_t tid)
{
	for (;;) {
		int status = 0;
		if (waitpid(tid, &status, __WALL) >= 0)
			return status;
		if (errno != EINTR)
			return errno_error("wait for thread %d", tid);
	}
}

#if defined(__x86_64__)
// Runs one system call in tid, which is at a syscall-exit stop (so its instruction pointer follows a
// `syscall` instruction), and puts its registers back: the thread then returns from its own call as if
// nothing had happened. The result, or the error the call returned.
Result<long> inject_syscall(pid_t tid, long nr, uint64_t a0, uint64_t a1, uint64_t a2)
{
	user_regs_struct saved{};
	if (ptrace(PTRACE_GETREGS, tid, nullptr, &saved) != 0)
		return errno_error("read the registers of thread %d", tid);
	errno = 0;
	long word = ptrace(PTRACE_PEEKTEXT, tid, saved.rip - 2, nullptr);
	if (errno != 0 || (word & 0xffff) != 0x050f)
		return make_error(EINVAL, "thread %d: no syscall instruction before %#llx", tid, saved.rip);
	user_regs_struct regs = saved;
	regs.rax = static_cast<uint64_t>(nr);
	regs.orig_rax = ~0ULL; // no system call to restart on the way out of this stop
	regs.rdi = a0;
	regs.rsi = a1;
	regs.rdx = a2;
	regs.rip = saved.rip - 2;
	if (ptrace(PTRACE_SETREGS, tid, nullptr, &regs) != 0)
		return errno_error("set the registers of thread %d", tid);
	Result<long> out = make_error(EIO, "thread %d: system call %ld not completed", tid, nr);
	int stops = 0;
	while (stops < 2) { // its entry, then its exit
		if (ptrace(PTRACE_SYSCALL, tid, nullptr, 0) != 0) {
			out = errno_error("resume thread %d for system call %ld", tid, nr);
			break;
		}
		auto status = wait_stop(tid);
		if (!status) {
			out = std::move(status).error();
			break;
		}
		if (!is_syscall_stop(*status)) {
			out = make_error(EIO, "thread %d stopped otherwise (status %#x) during system call %ld", tid,
					 *status, nr);
			break;
		}
		stops++;
	}
	if (stops == 2 && ptrace(PTRACE_GETREGS, tid, nullptr, &regs) == 0) {
		long rv = static_cast<long>(regs.rax);
		out = rv < 0 && rv > -4096 ? Result<long>(make_error(static_cast<int>(-rv), "system call %ld", nr))
					   : Result<long>(rv);
	}
	if (ptrace(PTRACE_SETREGS, tid, nullptr, &saved) != 0)
		return errno_error("put back the registers of thread %d", tid);
	return out;
}

#endif

} // namespace

Result<ThreadRun> ThreadRun::start(pid_t tid, std::optional<BufferPolicy> buffer)
{
	auto status = read_task_status(tid);
	if (!status)
		return std::move(status).error().context("restore thread %d", tid);
	if (status->tracer != gettid())
		return ThreadRun(tid, status->tgid, 0, 0, false);

	// The options CRIU (compel) set when it seized the thread: TRACESYSGOOD, plus SUSPEND_SECCOMP for a
	// thread under seccomp.
	long options = PTRACE_O_TRACESYSGOOD | (status->seccomp ? PTRACE_O_SUSPEND_SECCOMP : 0);
	uint64_t mask = 0;
	if (ptrace(PTRACE_GETSIGMASK, tid, sizeof(mask), &mask) != 0)
		return errno_error("PTRACE_GETSIGMASK on restore thread %d", tid);

	uint64_t block = ~0ULL & ~(1ULL << (SIGTRAP - 1));
	if (ptrace(PTRACE_SETSIGMASK, tid, sizeof(block), &block) != 0)
		return errno_error("PTRACE_SETSIGMASK on restore thread %d", tid);
	ThreadRun run(tid, status->tgid, mask, options, true); // from here on, the destructor puts things back
	if (kCanPrepareBuffer)
		run.policy_ = buffer;
	long run_options = run.policy_ ? PTRACE_O_TRACESYSGOOD : 0;
	if (ptrace(PTRACE_SETOPTIONS, tid, nullptr, run_options) != 0 ||
	    ptrace(run.policy_ ? PTRACE_SYSCALL : PTRACE_CONT, tid, nullptr, 0) != 0) {
		Error err = errno_error("resume restore thread %d", tid);
		run.running_ = false; // not resumed: only the mask and options need putting back
		ptrace(PTRACE_SETSIGMASK, tid, sizeof(mask), &mask);
		ptrace(PTRACE_SETOPTIONS, tid, nullptr, options);
		return err;
	}
	return run;
}

ThreadRun::ThreadRun(ThreadRun &&other) noexcept
	: tid_(other.tid_), tgid_(other.tgid_), saved_mask_(other.saved_mask_), saved_options_(other.saved_options_),
	  running_(std::exchange(other.running_, false)), policy_(other.policy_), ended_(other.ended_),
	  pending_len_(other.pending_len_), entry_nr_(other.entry_nr_), report_(std::move(other.report_)),
	  held_stop_(other.held_stop_)
{
}

ThreadRun::~ThreadRun()
{
	if (!running_)
		return;
	try {
		if (auto st = stop(); !st)
			LOG_ERROR("%s", st.error().message().c_str());
	} catch (...) { // only an allocation of a message can fail: the thread is stopped by then
		LOG_ERROR("restore thread %d: stopping it again failed", tid_);
	}
}

// The signal to hand back to the thread at a signal-delivery stop (wait status stop_status): the one it
// took, but a stop signal, held back for stop().
int ThreadRun::signal_to_deliver(int stop_status)
{
	int sig = WSTOPSIG(stop_status);
	if (sig != SIGSTOP && sig != SIGTSTP && sig != SIGTTIN && sig != SIGTTOU)
		return sig;
	held_stop_ = sig;
	return 0;
}

bool ThreadRun::tend()
{
	bool any = false;
	while (running_ && !ended_) {
		int status = 0;
		pid_t r = waitpid(tid_, &status, __WALL | WNOHANG);
		if (r == 0 || (r < 0 && errno != EINTR))
			break;
		if (r < 0)
			continue;
		any = true;
		if (WIFEXITED(status) || WIFSIGNALED(status)) {
			ended_ = status; // stop() reports it
			break;
		}
		if (!WIFSTOPPED(status))
			continue;
		int sig = 0;
		if (is_syscall_stop(status))
			on_syscall_stop();
		else if (!(status >> 16))
			sig = signal_to_deliver(status); // as an untraced run would, but a stop
		if (ptrace(policy_ ? PTRACE_SYSCALL : PTRACE_CONT, tid_, nullptr, sig) != 0 && errno == ESRCH)
			break; // it is gone: stop() says so
	}
	return any;
}

void ThreadRun::on_syscall_stop()
{
#if defined(__x86_64__)
	__ptrace_syscall_info info{};
	if (ptrace(PTRACE_GET_SYSCALL_INFO, tid_, sizeof(info), &info) <= 0)
		return;
	if (info.op == PTRACE_SYSCALL_INFO_ENTRY) {
		entry_nr_ = static_cast<long>(info.entry.nr);
		pending_len_ = 0;
		if (entry_nr_ != SYS_mmap)
			return;
		const auto *a = info.entry.args;
		MmapRequest req{a[0], a[1], a[2], a[3], static_cast<int64_t>(static_cast<int32_t>(a[4])), a[5]};
		if (!is_checkpoint_buffer(req, policy_->min_bytes))
			return;
		user_regs_struct regs{};
		if (ptrace(PTRACE_GETREGS, tid_, nullptr, &regs) != 0) {
			report_.problem = errno_error("read the registers of restore thread %d", tid_).message();
			return;
		}
		regs.r10 &= ~static_cast<uint64_t>(MAP_POPULATE); // the kernel reads the arguments after this stop
		if (ptrace(PTRACE_SETREGS, tid_, nullptr, &regs) != 0) {
			report_.problem = errno_error("set the registers of restore thread %d", tid_).message();
			return;
		}
		pending_len_ = req.len;
		return;
	}
	if (info.op != PTRACE_SYSCALL_INFO_EXIT || !pending_len_ || entry_nr_ != SYS_mmap)
		return;
	uint64_t len = std::exchange(pending_len_, 0);
	if (info.exit.is_error || info.exit.rval == 0)
		return; // the driver's mmap failed: it says so itself
	prepare_buffer(static_cast<uint64_t>(info.exit.rval), len);
#endif
}

// The thread is at the exit of the buffer's mmap: nothing has touched the mapping yet, and no other thread
// of the process runs.
void ThreadRun::prepare_buffer(uint64_t addr, uint64_t len)
{
#if defined(__x86_64__)
	report_.mappings++;
	report_.bytes += len;
	bool huge = false;
	if (policy_->huge_pages) {
		auto r = inject_syscall(tid_, SYS_madvise, addr, len, MADV_HUGEPAGE);
		if (r)
			huge = true;
		else
			report_.problem = std::move(r).error().context("madvise(MADV_HUGEPAGE) in restore thread %d", tid_).message();
	}
	report_.huge_pages = (report_.mappings == 1 || report_.huge_pages) && huge;
	ThpCounters before = huge ? read_thp_counters() : ThpCounters{};
	uint64_t t0 = now_us();
	// process_vm_writev takes any thread of a process: it works on the thread's memory map.
	Status st = populate_process_memory(tid_, addr, len, policy_->threads);
	report_.populate_us += now_us() - t0;
	if (huge) {
		ThpCounters after = read_thp_counters();
		report_.huge_faults += after.faults - before.faults;
		report_.fallbacks += after.fallbacks - before.fallbacks;
		report_.compact_stalls += after.compact_stalls - before.compact_stalls;
	}
	if (!st)
		report_.problem = std::move(st).error().context("populate the driver's buffer").message();
#else
	(void)addr;
	(void)len;
#endif
}

Status ThreadRun::stop()
{
	if (!running_)
		return {};
	running_ = false;
	if (ended_)
		return make_error(ESRCH, "restore thread %d exited while it ran (%s %d)", tid_,
				  WIFEXITED(*ended_) ? "exit code" : "signal",
				  WIFEXITED(*ended_) ? WEXITSTATUS(*ended_) : WTERMSIG(*ended_));
	if (ptrace(PTRACE_INTERRUPT, tid_, nullptr, 0) != 0)
		return errno_error("PTRACE_INTERRUPT on restore thread %d", tid_);
	for (;;) {
		auto status = wait_stop(tid_);
		if (!status)
			return std::move(status).error().context("restore thread %d did not stop", tid_);
		if (WIFEXITED(*status) || WIFSIGNALED(*status))
			return make_error(ESRCH, "restore thread %d exited while it ran (%s %d)", tid_,
					  WIFEXITED(*status) ? "exit code" : "signal",
					  WIFEXITED(*status) ? WEXITSTATUS(*status) : WTERMSIG(*status));
		if (!WIFSTOPPED(*status))
			continue;
		if (is_event_stop(*status))
			break; // the interrupt (or a group stop) took hold
		int sig = 0;
		if (is_syscall_stop(*status))
			ptrace(PTRACE_INTERRUPT, tid_, nullptr, 0); // a traced call's stop came first: ask again
		else
			sig = signal_to_deliver(*status); // a signal-delivery stop: hand the signal back
		if (ptrace(PTRACE_CONT, tid_, nullptr, sig) != 0)
			return errno_error("continue restore thread %d after a stop (status %#x)", tid_, *status);
	}
	// Pending for the process again: no thread takes it while CRIU holds them, all stop once it lets go.
	if (held_stop_ && kill(tgid_, held_stop_) != 0)
		LOG_ERROR("restore thread %d took signal %d, and it cannot be queued again for process %d: %s; stop "
			  "it with kill -STOP %d",
			  tid_, held_stop_, tgid_, std::strerror(errno), tgid_);
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
