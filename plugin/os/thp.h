// Transparent huge pages: the kernel's settings that decide whether the driver's checkpoint buffer gets
// huge pages. The driver copies GPU memory into fresh anonymous memory of the process and never asks for
// huge pages (no MADV_HUGEPAGE), so only the mode `always` gives them to it (docs/benchmarks.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace cuda_criu {

inline constexpr const char *kThpSysfsDir = "/sys/kernel/mm/transparent_hugepage";

// The selected word of a THP sysfs file, the one in brackets: "always [madvise] never\n" -> "madvise".
// An error when no word is bracketed, more than one is, or a bracket is unmatched.
Result<std::string> parse_thp_choice(std::string_view text);

struct ThpSettings {
	std::string enabled; // DIR/enabled: always, madvise or never
	std::string defrag;  // DIR/defrag: always, defer, defer+madvise, madvise or never; "" when unreadable
	// Kernels from 6.8 have a control per huge page size; the PMD size's (hugepages-2048kB on x86-64)
	// overrides `enabled` unless it says inherit. Both "" on older kernels.
	std::string pmd_size_file; // that file's path
	std::string pmd_size_mode; // always, inherit, madvise or never
	// What applies to PMD-sized anonymous huge pages, the ones the measurements are about: pmd_size_mode,
	// or enabled where that is inherit or absent.
	std::string pmd_mode;
};

// The settings under dir (kThpSysfsDir; another directory in tests). An error, naming the file, when
// DIR/enabled cannot be read or parsed (a kernel built without CONFIG_TRANSPARENT_HUGEPAGE has no DIR).
Result<ThpSettings> read_thp_settings(const std::string &dir = kThpSysfsDir);

// The kernel's counters of huge page faults and of compaction (/proc/vmstat): read before and after the
// plugin populates a buffer, their difference says whether the buffer got huge pages, and what that cost
// where free memory was fragmented. They are the machine's: another process's faults in that time (another
// dumped process's populate, checkpointed in parallel) count too.
struct ThpCounters {
	uint64_t faults = 0;         // thp_fault_alloc: a huge page given to a fault
	uint64_t fallbacks = 0;      // thp_fault_fallback: a fault that asked for one and got 4 KiB pages
	uint64_t compact_stalls = 0; // compact_stall: a thread that compacted memory itself before it could go on
};
ThpCounters parse_thp_counters(std::string_view vmstat);
// /proc/vmstat's; all zero where it cannot be read.
ThpCounters read_thp_counters();

} // namespace cuda_criu
