// The OS and driver layers against the real system: what counts as a GPU device node, the driver
// library's load errors, and the small-file reader.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sched.h>
#include <thread>
#include <string>

#include "base/format.h"
#include "base/text.h"
#include "driver/libcuda.h"
#include "os/fs_context.h"
#include "os/host.h"
#include "os/maps.h"
#include "os/mem_file.h"
#include "os/proc.h"
#include "os/thread_run.h"
#include "temp_dir.h"

namespace cuda_criu {
namespace {

using testing::TempDir;

// Where CRIU has joined another pid namespace for the tasks it forks (a pod's shared one), the kernel
// refuses a thread; ThreadsAllowed lets one start and leaves CRIU's choice in place afterwards. In a child
// whose pid namespace for children is a new one (unshare), as CRIU's is after its setns().
TEST(ThreadsAllowed, ThreadsStartWhereCriuJoinedAnotherPidNamespace)
{
	if (geteuid() != 0)
		GTEST_SKIP() << "a new pid namespace needs root";
	pid_t child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		auto ns = [](const char *which) {
			struct stat st{};
			return stat(which, &st) == 0 ? st.st_ino : 0;
		};
		auto thread_starts = [] {
			try {
				std::thread([] {}).join();
				return true;
			} catch (const std::system_error &) {
				return false;
			}
		};
		if (unshare(CLONE_NEWPID) != 0)
			_exit(10);
		pid_t init = fork(); // the namespace's init (a pod's pause): only then can others join it
		if (init == 0) {
			pause();
			_exit(0);
		}
		auto end = [init](int code) {
			if (init > 0)
				kill(init, SIGKILL);
			_exit(code);
		};
		ino_t joined = ns("/proc/thread-self/ns/pid_for_children");
		if (init < 0 || !joined || joined == ns("/proc/thread-self/ns/pid"))
			end(11);
		if (thread_starts())
			end(12); // the kernel would have let it: nothing to test
		{
			ThreadsAllowed allowed;
			if (!thread_starts())
				end(13);
		}
		if (ns("/proc/thread-self/ns/pid_for_children") != joined)
			end(14); // CRIU's choice is not back
		if (thread_starts())
			end(15);
		end(0);
	}
	int status = 0;
	ASSERT_EQ(waitpid(child, &status, 0), child);
	ASSERT_TRUE(WIFEXITED(status));
	if (WEXITSTATUS(status) == 10)
		GTEST_SKIP() << "unshare(CLONE_NEWPID) is not allowed here";
	EXPECT_EQ(WEXITSTATUS(status), 0) << "step " << WEXITSTATUS(status) << " failed";
	{
		ThreadsAllowed same; // the namespaces are the same here: nothing to do
		std::thread([] {}).join();
	}
}

// A file merely named like a GPU's device node is not a GPU; nor is a name too long for an int.
// The memory compressed GPU state is decoded into: found by its line in the process's maps, on 2 MiB pages
// where the process may mount a tmpfs of its own (root), whatever the host's shmem_enabled, and given back
// whole.
TEST(MemFile, OnHugePagesFoundInTheMapsAndGivenBack)
{
	constexpr uint64_t kBytes = 8 << 20;
	auto f = MemFile::create("cuda-criu-gpu-test", kBytes);
	ASSERT_TRUE(f.ok()) << f.error().message();
	ASSERT_TRUE(f->map().ok());
	ASSERT_EQ(madvise(f->data(), kBytes, MADV_POPULATE_WRITE), 0) << std::strerror(errno);
	std::memset(f->data(), 0x5a, kBytes);
	auto maps = read_maps(getpid());
	ASSERT_TRUE(maps.ok()) << maps.error().message();
	int found = 0;
	for (const Mapping &m : *maps)
		if (f->is(m)) {
			found++;
			EXPECT_EQ(m.start, reinterpret_cast<uint64_t>(f->data()));
			EXPECT_NE(m.path.find("cuda-criu-gpu-test"), std::string::npos) << m.path;
		}
	EXPECT_EQ(found, 1);
	if (geteuid() != 0)
		GTEST_SKIP() << "not root: no tmpfs of its own, a memfd (huge pages as the host's shmem_enabled says)";
	EXPECT_TRUE(f->huge());
	// smaps: the mapping's memory in huge pages (ShmemPmdMapped), where the kernel had 2 MiB pages free.
	auto smaps = read_small_file("/proc/self/smaps", 16 << 20);
	ASSERT_TRUE(smaps.ok());
	size_t at = smaps->find(format("%" PRIx64 "-", reinterpret_cast<uint64_t>(f->data())));
	ASSERT_NE(at, std::string::npos);
	size_t pmd = smaps->find("ShmemPmdMapped:", at);
	ASSERT_NE(pmd, std::string::npos);
	EXPECT_GT(std::strtoull(smaps->c_str() + pmd + 15, nullptr, 10), 0u) << smaps->substr(at, 1200);
	f->free_memory();
	struct stat st{};
	ASSERT_EQ(fstat(f->fd(), &st), 0);
	EXPECT_EQ(st.st_size, 0);
}

TEST(SystemHost, FilesNamedLikeGpuNodesAreNotGpus)
{
	TempDir dir;
	std::string names[] = {dir.path() + "/nvidia0", dir.path() + "/nvidia99999999999999999999"};
	int fds[2];
	for (int i = 0; i < 2; i++) {
		std::ofstream(names[i]) << "x";
		fds[i] = open(names[i].c_str(), O_RDONLY | O_CLOEXEC);
		ASSERT_GE(fds[i], 0);
	}
	TaskInfo info = SystemHost().task_info(getpid());
	for (int fd : fds)
		close(fd);
	EXPECT_TRUE(info.nvidia_minors.empty()) << "first minor: " << info.nvidia_minors[0];
}

// A character device of the NVIDIA major is a GPU, whatever its name (held O_PATH: no driver needed).
TEST(SystemHost, NvidiaCharacterDevicesAreGpus)
{
	TempDir dir;
	std::string node = dir.path() + "/gpu-node";
	if (mknod(node.c_str(), S_IFCHR | 0600, makedev(195, 3)) != 0)
		GTEST_SKIP() << "cannot mknod (" << errno_string(errno) << "): needs root";
	std::string ctl = dir.path() + "/ctl-node";
	ASSERT_EQ(mknod(ctl.c_str(), S_IFCHR | 0600, makedev(195, 255)), 0);
	int fd = open(node.c_str(), O_PATH | O_CLOEXEC);
	int ctl_fd = open(ctl.c_str(), O_PATH | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	TaskInfo info = SystemHost().task_info(getpid());
	close(fd);
	close(ctl_fd);
	EXPECT_EQ(info.nvidia_minors, std::vector<unsigned>{3});
}

// CRIU reads -ENOTSUP from a hook as "not my process": a driver without the checkpoint API must fail
// with another errno, or the CUDA process would be dumped without its GPU state.
TEST(LibCuda, OldDriverIsNotReportedAsNotSupported)
{
	auto d = load_libcuda(CUDA_CRIU_FAKE_OLD_LIBCUDA);
	ASSERT_FALSE(d.ok());
	EXPECT_NE(d.error().errno_value(), ENOTSUP) << d.error().message();
	EXPECT_EQ(d.error().errno_value(), ENOSYS) << d.error().message();
	EXPECT_NE(d.error().message().find("no checkpoint API"), std::string::npos) << d.error().message();
}

char task_state(pid_t pid)
{
	auto st = read_task_status(pid);
	return st ? st->state : '?';
}

// A SIGSTOP pending for a ptrace-stopped process (CRIU queues one before the restore's device hook for
// --leave-stopped) is taken by the thread let run: ThreadRun holds it back, so the thread runs on, and
// queues it again at stop(), so the process stops once its tracer lets it go.
TEST(ThreadRun, AStopSignalTakenWhileRunningIsQueuedAgainAtStop)
{
	pid_t child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		for (;;)
			usleep(1000);
	}
	int status = 0;
	ASSERT_EQ(ptrace(PTRACE_SEIZE, child, nullptr, PTRACE_O_TRACESYSGOOD), 0) << strerror(errno);
	ASSERT_EQ(ptrace(PTRACE_INTERRUPT, child, nullptr, nullptr), 0);
	ASSERT_EQ(waitpid(child, &status, __WALL), child);
	ASSERT_TRUE(WIFSTOPPED(status));
	ASSERT_EQ(kill(child, SIGSTOP), 0); // pending: no thread of the child runs
	{
		auto run = ThreadRun::start(child);
		ASSERT_TRUE(run) << run.error().message();
		bool tended = false;
		for (int i = 0; i < 1000 && !tended; i++) {
			tended = run->tend();
			usleep(1000);
		}
		EXPECT_TRUE(tended); // the signal-delivery stop was seen and handled
		usleep(20000);
		EXPECT_NE(task_state(child), 't') << "the thread did not run on past the stop signal";
		ASSERT_TRUE(run->stop());
	}
	ASSERT_EQ(ptrace(PTRACE_DETACH, child, nullptr, nullptr), 0);
	char state = '?';
	for (int i = 0; i < 1000 && state != 'T'; i++) {
		usleep(1000);
		state = task_state(child);
	}
	EXPECT_EQ(state, 'T'); // the signal was queued again: stopped once let go
	kill(child, SIGKILL);
	waitpid(child, &status, 0);
}

TEST(Text, ReadSmallFile)
{
	TempDir dir;
	std::string f = dir.path() + "/f";
	std::ofstream(f) << "abc\n";
	struct stat st {};
	auto text = read_small_file(f, 16, &st);
	ASSERT_TRUE(text.ok()) << text.error().message();
	EXPECT_EQ(*text, "abc\n");
	EXPECT_TRUE(S_ISREG(st.st_mode));
	EXPECT_EQ(read_small_file(f, 2).error().errno_value(), EFBIG);
	EXPECT_EQ(read_small_file(dir.path() + "/none").error().errno_value(), ENOENT);
}

TEST(Text, PrintableEscapesControlCharacters)
{
	EXPECT_EQ(printable("NVIDIA H200"), "NVIDIA H200");
	EXPECT_EQ(printable("a\nError (criu): fake\x1b[2J"), "a\\x0aError (criu): fake\\x1b[2J");
	EXPECT_EQ(printable(std::string("a\0b\\", 4)), "a\\x00b\\\\");
	EXPECT_EQ(printable("\xc3\xa9"), "\\xc3\\xa9");
}

TEST(Text, HumanBytes)
{
	EXPECT_EQ(human_bytes(1ULL << 20), "1.0 MiB");
	EXPECT_EQ(human_bytes(16ULL << 30), "16.0 GiB");
}

} // namespace
} // namespace cuda_criu
