// Production driver: libcuda.so.1 loaded with dlopen on first need (never linked, so the plugin loads on
// machines without NVIDIA drivers), its symbols resolved once into a typed table, cuInit called once.
#pragma once

#include <string>

#include "driver/driver.h"
#include "os/nvidia.h" // nvidia_driver_present, kernel_driver_version: what the kernel says without a dlopen

namespace cuda_criu {

// Loads the driver library once per process and returns the shared instance; later calls return the
// same instance (or the same error). path: library to load; empty means "libcuda.so.1" through the
// dynamic loader's search path.
Result<Driver *> load_libcuda(const std::string &path);

// The driver library opened (dlopen RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE: kept for the process's life) but
// not initialised: for cuda-criu check, which reports on a library that may lack the checkpoint API.
struct LibcudaFile {
	void *handle = nullptr;
	std::string file;         // the file the loader picked, symbolic links resolved when possible
	std::string cuda_version; // "13.0" (cuDriverGetVersion), "" when unknown
};
Result<LibcudaFile> open_libcuda(const std::string &path);

// 13000 -> "13.0", as cuDriverGetVersion reports it.
std::string cuda_version_text(int version);

} // namespace cuda_criu
