// The driver seam: the CUDA driver's checkpoint API, named after its calls. Production code uses
// LibCuda (libcuda.so.1 loaded at run time); unit tests use an in-process fake.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/gpu.h"
#include "base/result.h"

namespace cuda_criu {

class Driver {
public:
	virtual ~Driver() = default;

	virtual Result<pid_t> restore_thread_id(pid_t pid) = 0;
	virtual Result<CudaState> state(pid_t pid) = 0;
	virtual Status lock(pid_t pid, unsigned timeout_ms) = 0;
	virtual Status checkpoint(pid_t pid) = 0;
	virtual Status restore(pid_t pid, const std::vector<GpuPair> &pairs) = 0;
	virtual Status unlock(pid_t pid) = 0;

	// The kernel driver's version ("580.159.04") or, failing that, the CUDA version ("13.0").
	virtual std::string version() const = 0;
	// The GPUs this machine offers, in the driver's ordinal order.
	virtual Result<std::vector<GpuInfo>> gpus() = 0;
	// Free memory of a GPU now, in bytes; 0 when unknown.
	virtual uint64_t free_bytes(const GpuUuid &uuid) = 0;
	// GPU memory each process uses now (over all GPUs), by pid; nullopt when the driver cannot tell.
	virtual std::optional<std::map<pid_t, uint64_t>> gpu_bytes_by_process() { return std::nullopt; }
	// The GPUs on which each process has a CUDA context now, by pid; nullopt when the driver cannot tell.
	virtual std::optional<std::map<pid_t, std::vector<GpuUuid>>> gpus_by_process() { return std::nullopt; }
};

} // namespace cuda_criu
