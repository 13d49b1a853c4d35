// The driver's checkpoint buffer. cuCheckpointProcessCheckpoint has the process's restore thread map one
// private anonymous region about as large as the GPU state with MAP_POPULATE, so the kernel first-touches
// all of it in that one mmap call, on that one thread, on 4 KiB pages unless THP is `always` (seen on the
// H200, driver 580: 1.2-1.7 s of a 2.0-2.6 s checkpoint of 4.6 GB; the copy into it afterwards 0.75 s).
// While the plugin lets the thread run it can trace its system calls (os/thread_run.h): it takes
// MAP_POPULATE out of that one request, gives the new mapping MADV_HUGEPAGE and populates it from its own
// threads before the thread goes on, so the driver writes into memory that is already there.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "base/result.h"

namespace cuda_criu {

// Whether this build can prepare the buffer: the system call tracing and injection (os/thread_run.cpp)
// are written for x86-64's registers; elsewhere the buffer is left to the driver.
#if defined(__x86_64__)
inline constexpr bool kCanPrepareBuffer = true;
#else
inline constexpr bool kCanPrepareBuffer = false;
#endif

// x86-64's PMD-sized huge page, the one MADV_HUGEPAGE gives anonymous memory.
inline constexpr uint64_t kHugePage = 2ULL << 20;

// The threads that populate the buffer: one per core, up to 16 (the machine's first-touch rate stops
// growing there: design notes, section 2).
unsigned default_buffer_threads();

// What the plugin does with the buffer (option huge-pages, core/options.h).
struct BufferPolicy {
	bool huge_pages = true; // MADV_HUGEPAGE on the buffer (false where THP is `never`)
	unsigned threads = default_buffer_threads(); // populating threads
	uint64_t min_bytes = 64ULL << 20; // smaller populated mappings are left to the driver
};

// One mmap request as the thread made it (the system call's six arguments).
struct MmapRequest {
	uint64_t addr = 0, len = 0, prot = 0, flags = 0;
	int64_t fd = -1;
	uint64_t offset = 0;
};

// Whether a request is the driver's buffer: fresh (no address asked for, no MAP_FIXED), private,
// anonymous, writable, populated and at least min_bytes. Only such a mapping may be written before the
// thread returns from mmap: nothing can hold data there yet.
bool is_checkpoint_buffer(const MmapRequest &r, uint64_t min_bytes);

// What preparing the buffers of one checkpoint did, for its log line.
struct BufferReport {
	unsigned mappings = 0;    // buffers seen
	uint64_t bytes = 0;       // their size
	uint64_t populate_us = 0; // time the plugin's threads took to populate them
	bool huge_pages = false;  // MADV_HUGEPAGE took on every one
	// What the kernel did while they were populated (os/thp.h, machine-wide counters): 2 MiB pages given,
	// faults that fell back to 4 KiB pages, threads that compacted memory first (free memory fragmented).
	uint64_t huge_faults = 0, fallbacks = 0, compact_stalls = 0;
	std::string problem;      // where something did not work: what the driver was left to do itself
};

// The pages the buffers got, for the log line: "huge pages", "4 KiB pages", or huge pages for a share of
// them with the faults that fell back and the compaction stalls (a host whose free memory is fragmented).
std::string buffer_pages(const BufferReport &r);

// Writes zeros over [addr, addr + len) of pid's memory from threads threads: the kernel populates the
// pages as they are written, in parallel. Only for memory that holds nothing yet.
Status populate_process_memory(pid_t pid, uint64_t addr, uint64_t len, unsigned threads);

} // namespace cuda_criu
