// The OS and driver layers against the real system: what counts as a GPU device node, the driver
// library's load errors, and the small-file reader.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
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
#include "os/decoded_share.h"
#include "os/file_pages.h"
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

// CRIU blocks SIGCHLD on its thread while it waits for a child it runs (cr_system: iptables, tar): a
// thread of the plugin's must not take the signal (CRIU's handler would reap that child there), which
// stays pending until CRIU's thread takes it. In a child, whose signal handling is its own.
TEST(OwnThread, ASignalForCriusProcessWaitsForCriusThread)
{
	pid_t child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		static std::atomic<pid_t> handled_on{0};
		struct sigaction sa{};
		sa.sa_handler = [](int) { handled_on = gettid(); };
		sigaction(SIGCHLD, &sa, nullptr);
		std::atomic<bool> stop{false};
		std::thread ours = own_thread([&] {
			while (!stop)
				usleep(1000);
		});
		sigset_t chld;
		sigemptyset(&chld);
		sigaddset(&chld, SIGCHLD);
		pthread_sigmask(SIG_BLOCK, &chld, nullptr);
		pid_t c = fork();
		if (c == 0)
			_exit(0);
		int code = waitpid(c, nullptr, 0) == c ? 0 : 1;
		usleep(100 * 1000); // time for another thread to take the signal, were it open to it
		sigset_t pending;
		sigpending(&pending);
		if (!code && handled_on != 0)
			code = 2; // our thread took it
		if (!code && !sigismember(&pending, SIGCHLD))
			code = 3;
		pthread_sigmask(SIG_UNBLOCK, &chld, nullptr); // delivered here, now
		if (!code && handled_on != gettid())
			code = 4;
		stop = true;
		ours.join();
		_exit(code);
	}
	int status = 0;
	ASSERT_EQ(waitpid(child, &status, 0), child);
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(WEXITSTATUS(status), 0) << "step " << WEXITSTATUS(status) << " failed";
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

TEST(FilePages, RunsOfMappedFilePagesOnly)
{
	constexpr uint64_t P = 1ULL << 63, F = 1ULL << 61;
	uint64_t e[] = {P | F, P | F, 0, P, P | F, F, P | F};
	EXPECT_EQ(file_page_runs(e, 7, 0x10000, 0x1000),
		  (std::vector<MemoryRange>{{0x10000, 0x12000}, {0x14000, 0x15000}, {0x16000, 0x17000}}));
	EXPECT_TRUE(file_page_runs(e, 0, 0x10000, 0x1000).empty());
}

TEST(FilePages, TheDriversLibrariesAreKnownByName)
{
	EXPECT_TRUE(is_driver_library("/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"));
	EXPECT_TRUE(is_driver_library("libcuda.so.1"));
	EXPECT_TRUE(is_driver_library("/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1"));
	EXPECT_FALSE(is_driver_library("/opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12"));
	EXPECT_FALSE(is_driver_library("/usr/lib/criu/cuda_plugin.so"));
	EXPECT_FALSE(is_driver_library("/srv/libcuda.so.d/libfoo.so"));
	EXPECT_FALSE(is_driver_library(""));
}

TEST(FilePages, CoalescesUpToTheCountAsked)
{
	std::vector<MemoryRange> r = {{0, 0x1000}, {0x2000, 0x3000}, {0x10000, 0x11000}, {0x40000, 0x41000}};
	EXPECT_EQ(coalesce_ranges(r, 0x1000, 10), (std::vector<MemoryRange>{{0, 0x3000}, {0x10000, 0x11000}, {0x40000, 0x41000}}));
	EXPECT_EQ(coalesce_ranges(r, 0x1000, 2), (std::vector<MemoryRange>{{0, 0x11000}, {0x40000, 0x41000}}));
	EXPECT_EQ(coalesce_ranges(r, 0, 1), (std::vector<MemoryRange>{{0, 0x41000}}));
	EXPECT_TRUE(coalesce_ranges({}, 0x1000, 1).empty());
}

// This process maps a file of 64 MiB, dropped from the page cache, and reads two pages far apart: those
// are found (with the neighbours the kernel reads and maps around a fault, a read-around window at the
// most), the untouched middle and anonymous memory are not; read ahead, middle pages come back into the
// page cache.
TEST(FilePages, PagesOfAMappedFileInUseAreFoundAndReadAhead)
{
	const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), pages = (64 << 20) / page;
	TempDir dir;
	std::string name = dir.file("data");
	dir.write("data", std::vector<uint8_t>(pages * page, 0x5a));
	int fd = open(name.c_str(), O_RDONLY | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(fdatasync(fd), 0);
	ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	auto *m = static_cast<volatile uint8_t *>(mmap(nullptr, pages * page, PROT_READ, MAP_PRIVATE, fd, 0));
	ASSERT_NE(m, MAP_FAILED);
	uint64_t base = reinterpret_cast<uintptr_t>(m);
	const uint64_t middle = base + pages / 2 * page, far = base + (pages - 1) * page;
	auto resident = [&](uint64_t at, size_t n) {
		std::vector<unsigned char> v(n);
		EXPECT_EQ(mincore(reinterpret_cast<void *>(at), n * page, v.data()), 0);
		return std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; });
	};
	if (resident(base, pages) != 0)
		GTEST_SKIP() << "this file system keeps the file cached whatever is asked: nothing to find or read ahead";
	EXPECT_EQ(m[0], 0x5a);
	EXPECT_EQ(m[(pages - 1) * page], 0x5a);
	auto maps = read_maps(getpid());
	ASSERT_TRUE(maps.ok());
	auto found = mapped_file_pages(getpid(), *maps, 1 << 20);
	ASSERT_TRUE(found.ok()) << found.error().message();
	auto covers = [&](uint64_t at) {
		return std::any_of(found->begin(), found->end(), [&](const MemoryRange &r) { return r.start <= at && at < r.end; });
	};
	EXPECT_TRUE(covers(base));
	EXPECT_TRUE(covers(far));
	EXPECT_FALSE(covers(middle)) << "a page never touched";
	std::vector<uint8_t> anon(4 * page, 1);
	EXPECT_FALSE(covers(reinterpret_cast<uintptr_t>(anon.data())));

	ASSERT_EQ(resident(middle, 32), 0);
	std::atomic<bool> stop{false};
	EXPECT_EQ(read_file_pages_ahead(getpid(), {{middle, middle + 32 * page}}, 1 << 30, stop), 32 * page);
	for (int i = 0; i < 200 && resident(middle, 32) < 32; i++)
		usleep(10000);
	EXPECT_EQ(resident(middle, 32), 32);
	EXPECT_EQ(read_file_pages_ahead(getpid(), {{middle, middle + 32 * page}}, 4 * page, stop), 4 * page) << "at most max_bytes";
	stop = true;
	EXPECT_EQ(read_file_pages_ahead(getpid(), {{middle, middle + 32 * page}}, 1 << 30, stop), 0u) << "stopped";
	munmap(const_cast<uint8_t *>(m), pages * page);
	close(fd);
}

// A container's libraries: a file of an overlay, mapped through the overlay, is found and asked for like any
// other (where /proc/PID/map_files leads to the overlay's file and its mount, as on kernel 6.18; where it
// leads to the layer's own file, on a mount no mountinfo lists, it is neither: the test says which). In a
// child with a mount namespace of its own; skipped where an overlay cannot be mounted (not root).
TEST(FilePages, AFileOfAnOverlayIsFoundAndReadAhead)
{
	const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
	TempDir dir;
	for (const char *d : {"lower", "upper", "work", "merged"})
		ASSERT_EQ(mkdir(dir.file(d).c_str(), 0700), 0);
	dir.write("lower/lib.so", std::vector<uint8_t>(16 * page, 0x5a));
	enum { kFound = 0, kNotFound = 2, kNotAsked = 3, kNoOverlay = 77 };
	pid_t child = fork();
	ASSERT_GE(child, 0);
	if (child == 0) {
		std::string opts = "lowerdir=" + dir.file("lower") + ",upperdir=" + dir.file("upper") + ",workdir=" + dir.file("work");
		if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
		    mount("overlay", dir.file("merged").c_str(), "overlay", 0, opts.c_str()) != 0)
			_exit(kNoOverlay);
		int fd = open(dir.file("merged/lib.so").c_str(), O_RDONLY | O_CLOEXEC);
		auto *m = static_cast<volatile uint8_t *>(mmap(nullptr, 16 * page, PROT_READ, MAP_PRIVATE, fd, 0));
		if (fd < 0 || m == MAP_FAILED || m[0] != 0x5a)
			_exit(kNoOverlay);
		uint64_t base = reinterpret_cast<uintptr_t>(m);
		auto maps = read_maps(getpid());
		auto found = maps.ok() ? mapped_file_pages(getpid(), *maps, 1 << 20) : maps.error();
		if (!found.ok() || !std::any_of(found->begin(), found->end(), [&](const MemoryRange &r) {
			    return r.start <= base && base < r.end;
		    }))
			_exit(kNotFound);
		std::atomic<bool> stop{false};
		_exit(read_file_pages_ahead(getpid(), {{base, base + 16 * page}}, 1 << 30, stop) == 16 * page ? kFound : kNotAsked);
	}
	int status = 0;
	ASSERT_EQ(waitpid(child, &status, 0), child);
	ASSERT_TRUE(WIFEXITED(status));
	if (WEXITSTATUS(status) == kNoOverlay)
		GTEST_SKIP() << "no overlay mount here (it needs root and the overlay file system)";
	EXPECT_NE(WEXITSTATUS(status), kNotFound) << "the pages of a file mapped through an overlay were not found";
	EXPECT_NE(WEXITSTATUS(status), kNotAsked) << "the pages of a file mapped through an overlay were not asked for";
	EXPECT_EQ(WEXITSTATUS(status), kFound);
}

// A device mapped is never opened for a read-ahead (its open alone could act), nor a file of a file
// system that is not a local disk's (/proc here; FUSE or NFS, whose server may be a process CRIU holds).
TEST(FilePages, ADeviceMappedIsNeitherNotedNorOpened)
{
	const LocalMounts local;
	EXPECT_FALSE(open_regular_file("/dev/zero", local).valid());
	EXPECT_FALSE(open_regular_file("/proc/self/status", local).valid());
	EXPECT_FALSE(open_regular_file("/proc/self", local).valid());
	int fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
	ASSERT_GE(fd, 0);
	const size_t len = 16 * static_cast<size_t>(sysconf(_SC_PAGESIZE));
	auto *m = static_cast<volatile uint8_t *>(mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0));
	ASSERT_NE(m, MAP_FAILED);
	EXPECT_EQ(m[0], 0);
	uint64_t base = reinterpret_cast<uintptr_t>(m);
	auto maps = read_maps(getpid());
	ASSERT_TRUE(maps.ok());
	auto found = mapped_file_pages(getpid(), *maps, 1 << 20);
	ASSERT_TRUE(found.ok());
	for (const MemoryRange &r : *found)
		EXPECT_FALSE(r.start < base + len && base < r.end);
	std::atomic<bool> stop{false};
	EXPECT_EQ(read_file_pages_ahead(getpid(), {{base, base + len}}, 1 << 30, stop), 0u);
	munmap(const_cast<uint8_t *>(m), len);
	close(fd);
}

TEST(DecodedShare, RecordsRoundTripAndOddOnesAreRefused)
{
	DecodedRecord r{4242, 123456, 17, 0x2d, 99, 8 << 20, true, DecodedRecord::kDecoded};
	EXPECT_EQ(parse_decoded_record(format_decoded_record(r)), r);
	for (const char *bad : {"", "4242 1 17 45 99 8388608 1\n", "4242 1 17 45 99 8388608 1 4\n", "0 1 17 45 99 1 0 0\n",
				"4242 1 -1 45 99 1 0 0\n", "4242 1 17 45 99 1 2 0\n", "4242 1 17 45 99 1 0 0\nextra"})
		EXPECT_FALSE(parse_decoded_record(bad).has_value()) << bad;
}

// Two restores of the same image at once: a child process publishes its memory file and decodes into it
// (or fails, or ends without a word, or drops it undecoded); this process joins it, maps the same memory, and waits for its
// verdict. The last of the two to let go is the one to free the memory.
TEST(DecodedShare, ASecondRestoreMapsTheFirstsMemoryAndWaitsForItsVerdict)
{
	TempDir dir;
	GpuLedgerPlace place{dir.file("gpu-reservations"), 1000};
	const uint64_t bytes = 4 << 20;
	for (const char *verdict : {"decoded", "failed", "gone", "dropped"}) {
		std::string key = std::string("img-1-") + verdict;
		int go[2], ready[2];
		ASSERT_EQ(pipe(go), 0);
		ASSERT_EQ(pipe(ready), 0);
		pid_t child = fork();
		ASSERT_GE(child, 0);
		if (child == 0) {
			close(go[1]);
			close(ready[0]);
			auto f = DecodedShare::open(&place, key, "cuda-criu-gpu-test", bytes);
			if (!f || !f->second || f->second->joined() || !f->first->map().ok())
				_exit(10);
			std::memset(f->first->data(), 0x77, bytes);
			(void)!write(ready[1], "r", 1);
			char c;
			(void)!read(go[0], &c, 1); // the parent has joined
			if (std::string(verdict) == "gone")
				_exit(0);
			if (std::string(verdict) == "dropped") { // its restore ended before decoding; the file stays open
				f->second.reset();
				(void)!read(go[0], &c, 1);
				_exit(0);
			}
			f->second->tell(std::string(verdict) == "decoded");
			(void)!read(go[0], &c, 1); // the parent has let go
			_exit(f->second->leave() ? 0 : 11);
		}
		close(go[0]);
		close(ready[1]);
		char c;
		ASSERT_EQ(read(ready[0], &c, 1), 1);
		auto f = DecodedShare::open(&place, key, "cuda-criu-gpu-test", bytes);
		ASSERT_TRUE(f.ok()) << f.error().message();
		ASSERT_TRUE(f->second);
		EXPECT_TRUE(f->second->joined()) << verdict;
		EXPECT_EQ(f->second->publisher(), child);
		ASSERT_TRUE(f->first->map().ok());
		EXPECT_EQ(f->first->data()[bytes - 1], 0x77) << "the same memory";
		ASSERT_EQ(write(go[1], "j", 1), 1);
		std::atomic<bool> cancel{false};
		auto t0 = std::chrono::steady_clock::now();
		bool decoded = f->second->wait(cancel);
		EXPECT_EQ(decoded, std::string(verdict) == "decoded") << verdict;
		EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << verdict << ": told at once, not timed out";
		bool gone = std::string(verdict) == "gone";
		int status = 0;
		if (gone) { // reaped first: its exit has let go of the file (its flock goes with the last close)
			ASSERT_EQ(waitpid(child, &status, 0), child);
		}
		EXPECT_EQ(f->second->leave(), gone) << verdict << ": the last one to let go frees it";
		if (!gone) {
			ASSERT_EQ(write(go[1], "l", 1), 1);
			ASSERT_EQ(waitpid(child, &status, 0), child);
		}
		EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << verdict << ": status " << status;
		close(go[1]);
		close(ready[0]);
	}
	// With no restore of it in progress, a restore publishes its own.
	auto alone = DecodedShare::open(&place, "img-2", "cuda-criu-gpu-test", bytes);
	ASSERT_TRUE(alone.ok());
	EXPECT_FALSE(alone->second->joined());
	EXPECT_TRUE(alone->second->leave()) << "no one else holds it";
	// No place, or a key that is no file name: not shared.
	auto unshared = DecodedShare::open(nullptr, "img-3", "cuda-criu-gpu-test", bytes);
	ASSERT_TRUE(unshared.ok());
	EXPECT_FALSE(unshared->second);
	auto odd = DecodedShare::open(&place, "../x", "cuda-criu-gpu-test", bytes);
	ASSERT_TRUE(odd.ok());
	EXPECT_FALSE(odd->second);
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
