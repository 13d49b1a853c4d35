#include "os/fs_context.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cuda_criu {

SignalsBlocked::SignalsBlocked()
{
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &saved_);
}

SignalsBlocked::~SignalsBlocked() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

void use_own_fs_context()
{
	// Fails only without memory; the thread then shares CRIU's fs_struct, as without this call.
	(void)unshare(CLONE_FS);
}

ThreadsAllowed::ThreadsAllowed()
{
	struct stat own{}, children{};
	if (stat("/proc/thread-self/ns/pid", &own) != 0 || stat("/proc/thread-self/ns/pid_for_children", &children) != 0 ||
	    (own.st_dev == children.st_dev && own.st_ino == children.st_ino))
		return;
	int joined = open("/proc/thread-self/ns/pid_for_children", O_RDONLY | O_CLOEXEC);
	int mine = open("/proc/thread-self/ns/pid", O_RDONLY | O_CLOEXEC);
	if (joined >= 0 && mine >= 0 && setns(mine, CLONE_NEWPID) == 0)
		joined_ = joined;
	else if (joined >= 0)
		close(joined);
	if (mine >= 0)
		close(mine);
}

ThreadsAllowed::~ThreadsAllowed()
{
	if (joined_ < 0)
		return;
	(void)setns(joined_, CLONE_NEWPID); // a namespace this thread was in before: allowed again
	close(joined_);
}

void run_with_own_fs(const std::function<void()> &fn)
{
	own_thread([&] {
		use_own_fs_context();
		fn();
	}).join();
}

} // namespace cuda_criu
