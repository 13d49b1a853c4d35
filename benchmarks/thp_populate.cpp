// thp_populate: how fast the plugin populates a checkpoint buffer (os/checkpoint_buffer.h) on this host,
// with huge pages and without, on free memory as it is or fragmented first: the risk of MADV_HUGEPAGE on a
// host whose free memory is in small pieces (THP defrag `madvise` compacts memory in the faulting thread).
//
//   thp_populate [--gib N] [--threads T] [--fragment-gib F] [--no-huge]
//   thp_populate --fragment-gib F --hold       fragments F GiB, says so on stdout and holds it until killed
//                                             (bench.py --fragment-gib: a whole run on fragmented memory)
//
// A child maps N GiB (default 4) of fresh private anonymous memory, with MADV_HUGEPAGE unless --no-huge, as
// the driver's buffer is after the plugin's injected madvise; this process populates it with
// populate_process_memory from T threads (default: the plugin's, one per core up to 16). With
// --fragment-gib F another child first takes F GiB on 4 KiB pages and gives every other page back, so that
// the free memory is in 4 KiB holes (as on a host that has run for a long time), and holds the rest. Prints
// the rate, the share of the buffer on huge pages, and the kernel's compaction and THP counters
// (/proc/vmstat) over the populate, and the free memory in blocks of 2 MiB or more (/proc/buddyinfo).
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "os/checkpoint_buffer.h"

namespace {

constexpr uint64_t kGiB = 1ULL << 30;
constexpr uint64_t kPage = 4096;

[[noreturn]] void die(const char *what)
{
	std::perror(what);
	std::exit(1);
}

std::map<std::string, long long> vmstat()
{
	std::map<std::string, long long> v;
	std::ifstream f("/proc/vmstat");
	std::string k;
	long long n = 0;
	while (f >> k >> n)
		v[k] = n;
	return v;
}

// Free memory in blocks of order 9 (2 MiB) and more, all zones, in GiB.
double free_huge_gib()
{
	std::ifstream f("/proc/buddyinfo");
	std::string line;
	double bytes = 0;
	while (std::getline(f, line)) {
		std::istringstream in(line);
		std::string node, id, zone, word;
		in >> node >> id >> word >> zone;
		long long count = 0;
		for (int order = 0; in >> count; order++)
			if (order >= 9)
				bytes += static_cast<double>(count) * static_cast<double>(kPage << order);
	}
	return bytes / static_cast<double>(kGiB);
}

// Forks a child that runs body(write end of a pipe), then pauses until killed; returns its pid and what it
// wrote (one uint64_t).
pid_t child(uint64_t &out, void (*body)(int, uint64_t, bool), uint64_t arg, bool flag)
{
	int p[2];
	if (pipe(p) != 0)
		die("pipe");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		close(p[0]);
		body(p[1], arg, flag);
		for (;;)
			pause();
	}
	close(p[1]);
	if (read(p[0], &out, sizeof(out)) != static_cast<ssize_t>(sizeof(out)))
		die("child");
	close(p[0]);
	return pid;
}

void fragment(uint64_t bytes)
{
	auto *m = static_cast<char *>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	if (m == MAP_FAILED)
		die("mmap (fragment)");
	madvise(m, bytes, MADV_NOHUGEPAGE);
	for (uint64_t off = 0; off < bytes; off += kPage)
		m[off] = 1;
	for (uint64_t off = 0; off < bytes; off += 2 * kPage)
		madvise(m + off, kPage, MADV_DONTNEED);
}

void fragmenter(int fd, uint64_t bytes, bool)
{
	fragment(bytes);
	uint64_t done = 1;
	if (write(fd, &done, sizeof(done)) != static_cast<ssize_t>(sizeof(done)))
		_exit(1);
}

void buffer(int fd, uint64_t bytes, bool huge)
{
	void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		die("mmap (buffer)");
	if (huge && madvise(m, bytes, MADV_HUGEPAGE) != 0)
		die("madvise(MADV_HUGEPAGE)");
	auto addr = reinterpret_cast<uint64_t>(m);
	if (write(fd, &addr, sizeof(addr)) != static_cast<ssize_t>(sizeof(addr)))
		_exit(1);
}

long long anon_huge_kib(pid_t pid)
{
	std::ifstream f("/proc/" + std::to_string(pid) + "/smaps_rollup");
	std::string line;
	while (std::getline(f, line))
		if (line.rfind("AnonHugePages:", 0) == 0)
			return std::atoll(line.c_str() + 14);
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	double gib = 4, fragment_gib = 0;
	unsigned threads = cuda_criu::default_buffer_threads();
	bool huge = true, hold = false;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		if (a == "--gib" && i + 1 < argc)
			gib = std::atof(argv[++i]);
		else if (a == "--threads" && i + 1 < argc)
			threads = static_cast<unsigned>(std::atoi(argv[++i]));
		else if (a == "--fragment-gib" && i + 1 < argc)
			fragment_gib = std::atof(argv[++i]);
		else if (a == "--no-huge")
			huge = false;
		else if (a == "--hold")
			hold = true;
		else {
			std::fprintf(stderr, "usage: thp_populate [--gib N] [--threads T] [--fragment-gib F] [--no-huge] [--hold]\n");
			return 2;
		}
	}
	if (hold) {
		fragment(static_cast<uint64_t>(fragment_gib * static_cast<double>(kGiB)));
		std::printf("fragmented: %.1f GiB taken on 4 KiB pages, every other page given back; free in blocks >= "
			    "2 MiB: %.1f GiB; holding until killed\n",
			    fragment_gib, free_huge_gib());
		std::fflush(stdout);
		for (;;)
			pause();
	}
	auto bytes = static_cast<uint64_t>(gib * static_cast<double>(kGiB)) & ~(2 * 1024 * 1024 - 1ULL);
	uint64_t unused = 0;
	pid_t holder = 0;
	if (fragment_gib > 0) {
		holder = child(unused, fragmenter, static_cast<uint64_t>(fragment_gib * static_cast<double>(kGiB)), false);
		std::printf("fragmented: %.1f GiB taken on 4 KiB pages, every other page given back\n", fragment_gib);
	}
	double free_huge = free_huge_gib();
	uint64_t addr = 0;
	pid_t target = child(addr, buffer, bytes, huge);
	auto before = vmstat();
	auto t0 = std::chrono::steady_clock::now();
	cuda_criu::Status st = cuda_criu::populate_process_memory(target, addr, bytes, threads);
	double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
	auto after = vmstat();
	long long huge_kib = anon_huge_kib(target);
	kill(target, SIGKILL);
	if (holder)
		kill(holder, SIGKILL);
	while (wait(nullptr) > 0) {
	}
	if (!st) {
		std::fprintf(stderr, "populate: %s\n", st.error().message().c_str());
		return 1;
	}
	auto delta = [&](const char *k) { return after[k] - before[k]; };
	std::printf("%.1f GiB %s, %u threads: %.2f s, %.1f GB/s; %.0f%% on huge pages; free in blocks >= 2 MiB before: "
		    "%.1f GiB; compaction stalls %lld (success %lld, fail %lld), THP faults %lld, fallbacks %lld\n",
		    static_cast<double>(bytes) / static_cast<double>(kGiB), huge ? "MADV_HUGEPAGE" : "4 KiB pages", threads,
		    secs, static_cast<double>(bytes) / secs / 1e9,
		    100.0 * static_cast<double>(huge_kib) * 1024.0 / static_cast<double>(bytes), free_huge,
		    delta("compact_stall"), delta("compact_success"), delta("compact_fail"), delta("thp_fault_alloc"),
		    delta("thp_fault_fallback"));
	return 0;
}
