// The restore guard as a real process (no driver needed): when the plugin finishes, a process it was told
// is being restored is killed unless it was reported restored.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "core/guard.h"
#include "fakes.h"
#include "os/proc.h"

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

// What each fd of pid points at ("socket:[123]", "/dev/null", "anon_inode:[pidfd]").
std::map<int, std::string> fds_of(pid_t pid)
{
	std::map<int, std::string> out;
	std::string dir = "/proc/" + std::to_string(pid) + "/fd";
	if (DIR *d = opendir(dir.c_str())) {
		while (dirent *e = readdir(d)) {
			if (e->d_name[0] == '.')
				continue;
			char target[256] = {};
			if (readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1) > 0)
				out[std::atoi(e->d_name)] = target;
		}
		closedir(d);
	}
	return out;
}

// The guard's fds, when it was started by a process that had stdin and stdout closed and an fd of its
// own open (as CRIU has its log and image files): its socket at 3, CRIU's pidfd at 4, /dev/null at
// 0-2, nothing else. Exit code of the tester: 0 when so, else what was wrong.
int check_guard_fds()
{
	prctl(PR_SET_CHILD_SUBREAPER, 1); // the guard (a grandchild) is reparented here, to be found
	close(0);
	close(1);
	int criu_own = open("/dev/zero", O_RDONLY); // lands on 0: moved up, as CRIU's files sit anywhere
	if (criu_own < 0 || dup2(criu_own, 7) != 7)
		return 10;
	close(criu_own);
	auto guard = RestoreGuard::start();
	if (!guard)
		return 11;
	pid_t guard_pid = 0;
	for (int i = 0; i < 100 && !guard_pid; i++, usleep(10000))
		if (auto kids = children_of(getpid()); !kids.empty())
			guard_pid = kids.front();
	if (!guard_pid)
		return 12;
	usleep(100000); // let it place its fds
	auto fds = fds_of(guard_pid);
	int code = 0;
	if (fds.size() != 5)
		code = 13;
	else if (fds[3].rfind("socket:", 0) != 0)
		code = 14;
	else if (fds[4].find("pidfd") == std::string::npos)
		code = 15;
	else if (fds[0] != "/dev/null" || fds[1] != "/dev/null" || fds[2] != "/dev/null")
		code = 16;
	for (const auto &[fd, target] : fds)
		std::fprintf(stderr, "guard fd %d: %s\n", fd, target.c_str());
	kill(guard_pid, SIGKILL);
	waitpid(guard_pid, nullptr, 0);
	return code;
}

TEST(Guard, PlacesItsFdsWhateverFdsCriuHadOpen)
{
	pid_t tester = fork();
	ASSERT_GE(tester, 0);
	if (tester == 0)
		_exit(check_guard_fds());
	int st = 0;
	ASSERT_EQ(waitpid(tester, &st, 0), tester);
	ASSERT_TRUE(WIFEXITED(st));
	// 13: fds beyond 0-4; 14: no socket at 3; 15: no pidfd at 4 (the socket twice); 16: stdio not /dev/null
	EXPECT_EQ(WEXITSTATUS(st), 0);
}

TEST(ProcStartTime, TellsAReusedPidFromTheFirstProcess)
{
	EXPECT_NE(start_time_of(getpid()), 0u);
	EXPECT_EQ(start_time_of(getpid()), start_time_of(getpid()));
	pid_t p = start_sleeper();
	ASSERT_GT(p, 0);
	uint64_t t = start_time_of(p);
	EXPECT_NE(t, 0u);
	kill(p, SIGKILL);
	waitpid(p, nullptr, 0);
	EXPECT_EQ(start_time_of(p), 0u); // gone: a guard does not take a later process for it
}

// The dump guard's policy for a process CRIU left behind: put it back in the state it was found in, and
// say what it did. returned(): return_to_found for pid 30, now in state `now`, found in `found`.
ReturnOutcome returned(testing::FakeDriver &d, CudaState now, CudaState found, bool gone = false)
{
	d.add(30, now);
	auto out = return_to_found(d, 30, found, [gone] { return gone; }, 1000, 1);
	EXPECT_TRUE(out.ok()) << out.error().message();
	return out.ok() ? *out : ReturnOutcome{now, now, false};
}

TEST(DumpGuard, ReturnsACheckpointedProcessToRunning)
{
	testing::FakeDriver d;
	ReturnOutcome out = returned(d, CudaState::Checkpointed, CudaState::Running);
	EXPECT_EQ(out.left, CudaState::Checkpointed);
	EXPECT_EQ(out.now, CudaState::Running);
	EXPECT_TRUE(out.acted);
	EXPECT_EQ(d.state_of(30), CudaState::Running);
	EXPECT_EQ(d.calls, (std::vector<std::string>{"restore 30", "unlock 30"})); // state queries are not listed
}

TEST(DumpGuard, ReturnsACheckpointedProcessFoundLockedToLocked)
{
	testing::FakeDriver d;
	ReturnOutcome out = returned(d, CudaState::Checkpointed, CudaState::Locked);
	EXPECT_TRUE(out.acted);
	EXPECT_EQ(out.now, CudaState::Locked);
	EXPECT_EQ(d.state_of(30), CudaState::Locked);
	EXPECT_EQ(d.calls, (std::vector<std::string>{"restore 30"}));
}

TEST(DumpGuard, ReturnsALockedProcessToRunning)
{
	testing::FakeDriver d;
	ReturnOutcome out = returned(d, CudaState::Locked, CudaState::Running);
	EXPECT_EQ(out.left, CudaState::Locked);
	EXPECT_TRUE(out.acted);
	EXPECT_EQ(d.calls, (std::vector<std::string>{"unlock 30"}));
}

TEST(DumpGuard, LeavesAProcessInItsStateAlone)
{
	testing::FakeDriver d;
	ReturnOutcome out = returned(d, CudaState::Running, CudaState::Running);
	EXPECT_EQ(out.left, CudaState::Running);
	EXPECT_FALSE(out.acted);
	EXPECT_TRUE(d.calls.empty()); // no restore, no unlock
}

// Found locked, now running: the guard does not lock it again, and does not say it returned it.
TEST(DumpGuard, LeavesARunningProcessFoundLockedAsItIs)
{
	testing::FakeDriver d;
	ReturnOutcome out = returned(d, CudaState::Running, CudaState::Locked);
	EXPECT_EQ(out.left, CudaState::Running);
	EXPECT_EQ(out.now, CudaState::Running);
	EXPECT_FALSE(out.acted);
	EXPECT_TRUE(d.calls.empty());
}

// Nothing brings a process out of 'failed': no call, no retries, no error; it is left as it is.
TEST(DumpGuard, LeavesAFailedProcessAsItIs)
{
	for (CudaState found : {CudaState::Running, CudaState::Locked}) {
		testing::FakeDriver d;
		ReturnOutcome out = returned(d, CudaState::Failed, found);
		EXPECT_EQ(out.now, CudaState::Failed);
		EXPECT_FALSE(out.acted);
		EXPECT_TRUE(d.calls.empty());
	}
}

// CRIU's own restore was still under way: the guard's is refused, then that call returns the process;
// the guard did nothing and says so.
TEST(DumpGuard, DoesNotClaimAReturnItDidNotMake)
{
	testing::FakeDriver d;
	d.add(30, CudaState::Checkpointed);
	d.fail["restore"] = {30};
	int looks = 0;
	auto out = return_to_found(d, 30, CudaState::Locked,
				   [&] {
					   if (++looks == 2)
						   d.procs[30].state = CudaState::Locked; // CRIU's call has ended
					   return false;
				   },
				   1000, 1);
	ASSERT_TRUE(out.ok()) << out.error().message();
	EXPECT_EQ(out->left, CudaState::Checkpointed);
	EXPECT_EQ(out->now, CudaState::Locked);
	EXPECT_FALSE(out->acted);
}

TEST(DumpGuard, TouchesNothingOfAProcessThatIsGone)
{
	testing::FakeDriver d;
	ReturnOutcome out = returned(d, CudaState::Locked, CudaState::Running, true);
	EXPECT_FALSE(out.acted);
	EXPECT_EQ(out.now, CudaState::Running);
	EXPECT_TRUE(d.calls.empty());
}

TEST(DumpGuard, NamesTheStateItCouldNotLeave)
{
	testing::FakeDriver d;
	d.add(30, CudaState::Locked);
	d.fail["unlock"] = {30};
	auto out = return_to_found(d, 30, CudaState::Running, [] { return false; }, 0, 1);
	ASSERT_FALSE(out.ok());
	EXPECT_NE(out.error().message().find("it was left locked"), std::string::npos) << out.error().message();
}

// Forks a "CRIU" that starts a dump guard watching pid and exits; returns whether the guard then asked for
// the driver (it writes to a file: the guard closes every inherited fd).
bool guard_asked_for_driver(pid_t watched, int wait_ms)
{
	char path[] = "/tmp/cuda-criu-guard-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		return false;
	close(fd);
	std::string file = path;
	pid_t criu = fork();
	if (criu == 0) {
		auto guard = DumpGuard::start(
			[file]() -> Result<Driver *> {
				if (FILE *f = std::fopen(file.c_str(), "w")) {
					std::fputs("asked", f);
					std::fclose(f);
				}
				return make_error(ENOENT, "%s", "no driver in this test");
			},
			1000);
		if (!guard)
			_exit(1);
		guard->watch(watched, CudaState::Running);
		_exit(0);
	}
	int st = 0;
	waitpid(criu, &st, 0);
	bool asked = false;
	for (int waited = 0; !asked && waited < wait_ms; waited += 10) {
		FILE *f = std::fopen(file.c_str(), "r");
		char buf[8] = {};
		asked = f && std::fgets(buf, sizeof(buf), f) != nullptr;
		if (f)
			std::fclose(f);
		if (!asked)
			usleep(10000);
	}
	unlink(file.c_str());
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 && asked;
}

TEST(DumpGuard, ActsOnlyForAWatchedProcessAliveAfterCriuExited)
{
	pid_t alive = start_sleeper();
	ASSERT_GT(alive, 0);
	EXPECT_TRUE(guard_asked_for_driver(alive, 5000));
	kill(alive, SIGKILL);
	waitpid(alive, nullptr, 0);

	pid_t dead = start_sleeper();
	ASSERT_GT(dead, 0);
	kill(dead, SIGKILL);
	waitpid(dead, nullptr, 0);
	EXPECT_FALSE(guard_asked_for_driver(dead, 300));
}

} // namespace
} // namespace cuda_criu
