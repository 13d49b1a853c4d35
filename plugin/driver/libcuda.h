// Production driver: libcuda.so.1 loaded with dlopen on first need (never linked, so the plugin loads on
// machines without NVIDIA drivers), its symbols resolved once into a typed table, cuInit called once.
#pragma once

#include <memory>
#include <string>

#include "driver/driver.h"

namespace cuda_criu {

// Loads the driver library once per process and returns the shared instance; later calls return the
// same instance (or the same error). path: library to load; empty means "libcuda.so.1" through the
// dynamic loader's search path.
Result<Driver *> load_libcuda(const std::string &path);

// True when this machine looks like it has an NVIDIA driver (/proc/driver/nvidia/gpus has entries), or
// path names a library file. Costs a directory read, no dlopen.
bool nvidia_driver_present(const std::string &path);

// The kernel driver version from /sys/module/nvidia/version or /proc/driver/nvidia/version, or "".
std::string kernel_driver_version();

} // namespace cuda_criu
