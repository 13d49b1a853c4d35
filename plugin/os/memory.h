// Host memory a checkpoint can use: the driver copies a process's GPU memory into the process's own memory,
// charged to its memory cgroup. Read from /proc/meminfo and the cgroup file systems (v2 and v1).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace cuda_criu {

// MemAvailable of /proc/meminfo, in bytes; nullopt when it cannot be read.
std::optional<uint64_t> host_available_bytes();

// The memory cgroup that leaves pid the least room to grow: its own or an ancestor's limit.
struct CgroupRoom {
	std::string path;    // the cgroup's directory, e.g. /sys/fs/cgroup/kubepods/pod1/ctr
	uint64_t limit = 0;  // memory.max (v2) or memory.limit_in_bytes (v1)
	uint64_t usage = 0;  // memory.current (v2) or memory.usage_in_bytes (v1)
	uint64_t room() const { return limit > usage ? limit - usage : 0; }
};
// nullopt: no limit applies (or the cgroup files cannot be read). The cgroup file systems are found
// through /proc/self/mountinfo.
std::optional<CgroupRoom> tightest_memory_cgroup(pid_t pid);

} // namespace cuda_criu
