// The threads the plugin starts inside CRIU's process: a signal mask and a file-system context (fs_struct)
// of their own, away from CRIU's.
#pragma once

#include <signal.h>

#include <functional>
#include <thread>
#include <utility>

namespace cuda_criu {

// While it lives, the calling thread blocks every signal (glibc keeps its own two); threads it starts
// meanwhile begin with them blocked.
class SignalsBlocked {
public:
	SignalsBlocked();
	~SignalsBlocked();
	SignalsBlocked(const SignalsBlocked &) = delete;
	SignalsBlocked &operator=(const SignalsBlocked &) = delete;

private:
	sigset_t saved_;
};

// Starts fn on a new thread with every signal blocked from its first instruction, as every thread the
// plugin starts: a signal sent to CRIU's process goes to any one of its threads that does not block it,
// and CRIU blocks SIGCHLD on its own thread while it waits for a child it runs (iptables for
// --tcp-established, tar for a tmpfs). On a thread of ours, CRIU's SIGCHLD handler would reap that child
// and CRIU's own wait fail ("waitpid() failed: No child processes"); its SIGALRM (the seize timeout) too
// belongs on its thread. The threads a driver library starts from ours (cuInit's) inherit the mask.
// Throws std::system_error as std::thread does.
template <class Fn>
std::thread own_thread(Fn &&fn)
{
	SignalsBlocked blocked;
	return std::thread(std::forward<Fn>(fn));
}

// Gives the calling thread an fs_struct of its own (unshare(CLONE_FS)). Threads share the fs_struct of
// the thread that created them, and CRIU's setns() into a container's mount namespace (needed to dump
// its over-mounted /dev tmpfs) fails with EINVAL while its fs_struct is shared: every thread the plugin
// starts inside CRIU calls this first, and so do the threads a driver library starts from such a thread.
void use_own_fs_context();

// Runs fn on a new thread that has called use_own_fs_context(), and waits for it: for a driver library's
// initialisation (cuInit, nvmlInit), which starts threads of its own in the calling process.
void run_with_own_fs(const std::function<void()> &fn);

// While it lives, the calling thread can start threads even where CRIU has joined another pid namespace
// for the tasks it forks (setns(CLONE_NEWPID): a restore into a pod's shared pid namespace), after which
// the kernel refuses a thread (EINVAL): the thread's pid namespace for children is set back to its own,
// and to CRIU's choice again at the end. Threads started meanwhile keep theirs, and can start threads in
// turn. Nothing changes where the two are the same.
class ThreadsAllowed {
public:
	ThreadsAllowed();
	~ThreadsAllowed();
	ThreadsAllowed(const ThreadsAllowed &) = delete;
	ThreadsAllowed &operator=(const ThreadsAllowed &) = delete;

private:
	int joined_ = -1; // CRIU's pid namespace for children, set again at the end
};

} // namespace cuda_criu
