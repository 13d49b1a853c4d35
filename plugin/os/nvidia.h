// What the NVIDIA kernel driver tells through /proc/driver/nvidia and /sys/module/nvidia, without loading
// any library: the one place that reads them.
#pragma once

#include <string>
#include <vector>

#include "base/gpu.h"

namespace cuda_criu {

// Whether the NVIDIA kernel driver is loaded (/proc/driver/nvidia exists).
bool nvidia_kernel_driver_loaded();

// True when this machine looks like it has an NVIDIA GPU (/proc/driver/nvidia/gpus has entries), or
// libcuda_path names a library file (a driver library put somewhere on purpose). No dlopen.
bool nvidia_driver_present(const std::string &libcuda_path);

// The kernel driver version from /sys/module/nvidia/version or /proc/driver/nvidia/version, or "".
std::string kernel_driver_version();

// Every GPU the kernel driver has (/proc/driver/nvidia/gpus/*/information), whatever CUDA_VISIBLE_DEVICES
// says: ordinal = device minor, name = model, no memory size; in minor order. Empty without that directory.
std::vector<GpuInfo> kernel_gpus();

} // namespace cuda_criu
