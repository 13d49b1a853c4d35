// The driver seam: the CUDA driver's checkpoint API, named after its calls. Production code uses
// LibCuda (libcuda.so.1 loaded at run time); unit tests use an in-process fake.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/gpu.h"
#include "base/result.h"

namespace cuda_criu {

// The errno of a call about a process that has no CUDA state (the driver's CUDA_ERROR_NOT_INITIALIZED
// for it: seen on r580 for a process that never initialised CUDA, and for a child forked after its
// parent did).
constexpr int kNoCudaState = ENODATA;
// The errno of a call the driver refuses in the process's present state (CUDA_ERROR_ILLEGAL_STATE): the
// process is not in the state the call needs, or another call on it is in progress.
constexpr int kWrongState = EBUSY;

// GPU memory each process uses, and the GPUs on which each has a CUDA context, by pid.
using ProcessBytes = std::map<pid_t, uint64_t>;
using ProcessGpus = std::map<pid_t, std::vector<GpuUuid>>;

// X(Return, method, (parameters), (arguments)): every call of the seam that reaches the driver (libcuda,
// whose entry points driver/cuda_api.h lists, or NVML). Driver declares each one pure, TimedDriver
// (core/timed_driver.h) times each one; LibCuda and the unit tests' fake must override each one.
//   restore_thread_id .. unlock: the checkpoint API, one entry point each.
//   gpus: the GPUs this machine offers, in the driver's ordinal order.
//   free_bytes: free memory of a GPU now, in bytes; 0 when unknown.
//   gpu_bytes_by_process, gpus_by_process: now, over all GPUs; nullopt when the driver cannot tell.
//   gpu_bytes_on: GPU memory each process uses on one GPU now, those the driver tells of; nullopt when it
//   cannot tell at all.
#define CUDA_CRIU_DRIVER_CALLS(X)                                                  \
	X(Result<pid_t>, restore_thread_id, (pid_t pid), (pid))                    \
	X(Result<CudaState>, state, (pid_t pid), (pid))                            \
	X(Status, lock, (pid_t pid, unsigned timeout_ms), (pid, timeout_ms))       \
	X(Status, checkpoint, (pid_t pid), (pid))                                  \
	X(Status, restore, (pid_t pid, const std::vector<GpuPair> &pairs), (pid, pairs)) \
	X(Status, unlock, (pid_t pid), (pid))                                      \
	X(Result<std::vector<GpuInfo>>, gpus, (), ())                              \
	X(uint64_t, free_bytes, (const GpuUuid &uuid), (uuid))                     \
	X(std::optional<ProcessBytes>, gpu_bytes_by_process, (), ())               \
	X(std::optional<ProcessBytes>, gpu_bytes_on, (const GpuUuid &uuid), (uuid)) \
	X(std::optional<ProcessGpus>, gpus_by_process, (), ())

class Driver {
public:
	virtual ~Driver() = default;

#define CUDA_CRIU_DECLARE_CALL(ret, method, params, args) virtual ret method params = 0;
	CUDA_CRIU_DRIVER_CALLS(CUDA_CRIU_DECLARE_CALL)
#undef CUDA_CRIU_DECLARE_CALL

	// The kernel driver's version ("580.159.04") or, failing that, the CUDA version ("13.0"): known at
	// load time, no call.
	virtual std::string version() const = 0;
};

// Loads the driver on first need (libcuda is never touched for a dump without CUDA processes): LibCuda in
// the plugin, a fake in tests. The driver must stay valid for the life of the process: an abandoned call
// may still use it.
using DriverSource = std::function<Result<Driver *>()>;

} // namespace cuda_criu
