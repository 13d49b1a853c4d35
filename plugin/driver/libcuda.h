// Production driver: libcuda.so.1 loaded with dlopen on first need (never linked, so the plugin loads on
// machines without NVIDIA drivers), its symbols resolved once into a typed table, cuInit called once.
#pragma once

#include <functional>
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

// Runs fn on a new thread with a file-system context (fs_struct) of its own, and waits for it. A driver
// library's initialisation (cuInit, nvmlInit) starts threads in the calling process (CRIU); threads share
// the fs_struct of the thread that created them, and CRIU's setns() into a container's mount namespace
// (needed to dump its over-mounted /dev tmpfs) fails with EINVAL while its fs_struct is shared. Started
// from here, the library's threads share that thread's fs_struct, not CRIU's.
void run_with_own_fs(const std::function<void()> &fn);

} // namespace cuda_criu
