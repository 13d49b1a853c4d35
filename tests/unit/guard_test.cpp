// The restore guard as a real process (no driver needed): when the plugin finishes, a process it was told
// is being restored is killed unless it was reported restored.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/guard.h"

namespace cuda_criu {
namespace {

pid_t start_sleeper()
{
	pid_t pid = fork();
	if (pid == 0) {
		pause();
		_exit(0);
	}
	return pid;
}

// The signal that ended pid within ms (-1: it exited by itself, 0: it still runs).
int ended_by(pid_t pid, int ms)
{
	for (int waited = 0; waited < ms; waited += 10) {
		int st = 0;
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFSIGNALED(st) ? WTERMSIG(st) : -1;
		usleep(10000);
	}
	return 0;
}

TEST(RestoreGuard, KillsWhatIsNotRestoredWhenThePluginFinishes)
{
	pid_t restored = start_sleeper(), not_restored = start_sleeper(), unknown = start_sleeper();
	ASSERT_GT(restored, 0);
	ASSERT_GT(not_restored, 0);
	ASSERT_GT(unknown, 0);
	{
		auto guard = RestoreGuard::start();
		ASSERT_TRUE(guard) << guard.error().message();
		guard->restoring(restored);
		guard->restoring(not_restored);
		guard->restored(restored);
	} // the socket closes, as when the plugin finishes or CRIU dies
	EXPECT_EQ(ended_by(not_restored, 5000), SIGKILL);
	EXPECT_EQ(ended_by(restored, 300), 0);
	EXPECT_EQ(ended_by(unknown, 10), 0);
	for (pid_t p : {restored, unknown}) {
		kill(p, SIGKILL);
		waitpid(p, nullptr, 0);
	}
}

TEST(RestoreGuard, LeavesEverythingAloneAfterASuccessfulRestore)
{
	pid_t p = start_sleeper();
	ASSERT_GT(p, 0);
	{
		auto guard = RestoreGuard::start();
		ASSERT_TRUE(guard) << guard.error().message();
		guard->restoring(p);
		guard->restored(p);
	}
	EXPECT_EQ(ended_by(p, 300), 0);
	kill(p, SIGKILL);
	waitpid(p, nullptr, 0);
}

} // namespace
} // namespace cuda_criu
