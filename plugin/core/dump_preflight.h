// The preflights a dump runs once, before its first lock, over the whole tree CRIU dumps (from its root):
// whether the host has the memory the checkpoint will take (core/memory_check.h), and the image directory
// the room the image will take (core/space_check.h). Each is skipped, saying why, where it cannot tell;
// the options make a refusal a warning, or turn the check off.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>

#include "base/result.h"
#include "core/driver_calls.h"
#include "core/options.h"
#include "os/host.h"

namespace cuda_criu {

// The GPU memory each process uses, as NVML reports it through the driver.
struct TreeGpuMemory {
	std::map<pid_t, uint64_t> bytes;
	bool known = false; // NVML answered
};

// Asks within timeout_ms; unknown (logged: no memory preflight then) when NVML cannot tell.
TreeGpuMemory tree_gpu_memory(const SharedDriver &driver, unsigned timeout_ms);

Status preflight_memory(const Options &options, Host &host, pid_t root, const TreeGpuMemory &gpu);

// image_dir_fd: CRIU's image directory; -1: none (no check).
Status preflight_space(const Options &options, Host &host, pid_t root, int image_dir_fd, const TreeGpuMemory &gpu);

} // namespace cuda_criu
