// Which GPUs each process computes on, from NVML (libnvidia-ml.so.1, part of the driver; loaded at run
// time, optional). A CUDA process opens the device node of every GPU it can see, so its open files over-
// state the GPUs it uses; NVML lists the processes that hold a context on each GPU.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cuda_criu {

// pid (as this process sees it) -> UUIDs ("GPU-...") of the GPUs it has a context on; nullopt when NVML
// is not available (no NVIDIA driver, or a stand-in driver without it).
std::optional<std::map<pid_t, std::vector<std::string>>> nvml_gpu_processes();

} // namespace cuda_criu
