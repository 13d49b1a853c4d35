// What the CUDA driver API cannot tell without creating a context on each GPU, from NVML
// (libnvidia-ml.so.1, loaded at run time): a GPU's free memory (for a restore's GPU plan), its
// persistence mode (for cuda-criu check), and the GPU memory of each process (for a dump's memory
// preflight and its progress).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "driver/driver.h"

namespace cuda_criu {

// Loads and initialises NVML once (later calls are free); false when it is not there or fails.
bool load_nvml();

// Free memory of the GPU now, in bytes; 0 when unknown (no NVML, or it does not know the GPU).
uint64_t nvml_free_bytes(const GpuUuid &uuid);

// Whether the GPU's persistence mode is on; nullopt when unknown.
std::optional<bool> nvml_persistence_mode(const GpuUuid &uuid);

// GPU memory each process uses now, over all GPUs, by pid (as this process's pid namespace sees it);
// nullopt when NVML cannot tell. What a checkpoint will copy into the process's memory.
std::optional<std::map<pid_t, uint64_t>> nvml_gpu_bytes_by_process();

// GPU memory each process uses now on one GPU, by pid; nullopt when NVML cannot tell.
std::optional<std::map<pid_t, uint64_t>> nvml_gpu_bytes_on(const GpuUuid &uuid);

// The GPUs on which each process has a CUDA context now, by pid; nullopt when NVML cannot tell. A
// process may hold the device nodes of more GPUs than that (a framework that enumerates them all).
std::optional<std::map<pid_t, std::vector<GpuUuid>>> nvml_gpus_by_process();

} // namespace cuda_criu
