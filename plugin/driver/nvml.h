// What the CUDA driver API cannot tell without creating a context on each GPU, from NVML
// (libnvidia-ml.so.1, loaded at run time): a GPU's free memory (for a restore's GPU plan) and its
// persistence mode (for cuda-criu check).
#pragma once

#include <cstdint>
#include <optional>

#include "driver/driver.h"

namespace cuda_criu {

// Loads and initialises NVML once (later calls are free); false when it is not there or fails.
bool load_nvml();

// Free memory of the GPU now, in bytes; 0 when unknown (no NVML, or it does not know the GPU).
uint64_t nvml_free_bytes(const GpuUuid &uuid);

// Whether the GPU's persistence mode is on; nullopt when unknown.
std::optional<bool> nvml_persistence_mode(const GpuUuid &uuid);

} // namespace cuda_criu
