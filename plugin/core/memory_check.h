// The memory preflight of a dump: a checkpoint makes the driver copy each process's GPU memory into the
// process's own memory, charged to its memory cgroup. If that cannot fit, the kernel OOM-kills the process
// in the middle of the checkpoint; refuse before any process is touched instead.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "os/memory.h"

namespace cuda_criu {

struct CheckpointNeed {
	pid_t pid = 0;
	uint64_t bytes = 0;               // GPU memory in use: what the checkpoint adds to the process
	std::optional<CgroupRoom> cgroup; // the tightest memory limit over the process
};

// OK when every cgroup has room for the needs of its processes and the host's available memory covers
// them all; else an error (ENOMEM) naming the process or cgroup, the sizes and the fix.
Status check_checkpoint_memory(const std::vector<CheckpointNeed> &needs, std::optional<uint64_t> host_available);

} // namespace cuda_criu
