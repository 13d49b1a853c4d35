// Every CUDA driver entry point this project calls, in one list: the plugin's driver table, cuda-criu
// check's probe and report of the checkpoint API, the selftest workload and the test that the fake
// libcuda exports each one (tests/unit/fake_libcuda_test.cpp) are all made from it. To call a new driver
// function, add one line here (and use it through LibCuda in libcuda.cpp for the plugin: see "A driver
// call" in docs/architecture.md).
// Needs <cuda.h>: include it only from .cpp files whose target has the CUDA headers.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <string>

namespace cuda_criu {

// What a library without the entry point loses.
enum class EntryKind {
	Basic,      // any CUDA driver: the library is unusable without it
	Checkpoint, // the checkpoint API (driver r570 and newer)
	Describe,   // optional: describes GPUs (name, memory, PCI bus)
	Workload,   // used only by cuda-criu selftest's workload
};

// X(member, function, kind). The function names go through cuda.h's macros, so that the versioned
// symbol is resolved (cuDeviceTotalMem -> cuDeviceTotalMem_v2, cuMemAlloc -> cuMemAlloc_v2).
#define CUDA_CRIU_ENTRY_POINTS(X)                                                   \
	X(init, cuInit, Basic)                                                      \
	X(driver_get_version, cuDriverGetVersion, Basic)                            \
	X(get_error_name, cuGetErrorName, Basic)                                    \
	X(get_error_string, cuGetErrorString, Basic)                                \
	X(lock, cuCheckpointProcessLock, Checkpoint)                                \
	X(checkpoint, cuCheckpointProcessCheckpoint, Checkpoint)                    \
	X(restore, cuCheckpointProcessRestore, Checkpoint)                          \
	X(unlock, cuCheckpointProcessUnlock, Checkpoint)                            \
	X(get_state, cuCheckpointProcessGetState, Checkpoint)                       \
	X(get_restore_thread_id, cuCheckpointProcessGetRestoreThreadId, Checkpoint) \
	X(device_get_count, cuDeviceGetCount, Describe)                             \
	X(device_get, cuDeviceGet, Describe)                                        \
	X(device_get_name, cuDeviceGetName, Describe)                               \
	X(device_get_uuid, cuDeviceGetUuid, Describe)                               \
	X(device_total_mem, cuDeviceTotalMem, Describe)                             \
	X(device_get_pci_bus_id, cuDeviceGetPCIBusId, Describe)                     \
	X(primary_ctx_retain, cuDevicePrimaryCtxRetain, Workload)                   \
	X(ctx_set_current, cuCtxSetCurrent, Workload)                               \
	X(mem_alloc, cuMemAlloc, Workload)                                          \
	X(memcpy_htod, cuMemcpyHtoD, Workload)                                      \
	X(memcpy_dtoh, cuMemcpyDtoH, Workload)

#define CUDA_CRIU_SYMBOL_NAME_(name) #name
#define CUDA_CRIU_SYMBOL_NAME(name) CUDA_CRIU_SYMBOL_NAME_(name)

// The typed table. Members are typed from the real header so that a signature change breaks the build.
struct CudaApi {
#define CUDA_CRIU_MEMBER(member, function, kind) decltype(&::function) member = nullptr; // NOLINT(bugprone-macro-parentheses): a declaration
	CUDA_CRIU_ENTRY_POINTS(CUDA_CRIU_MEMBER)
#undef CUDA_CRIU_MEMBER
};

// Resolves every entry point of the list in lib; returns the names of those of `kind` that are missing
// ("cuCheckpointProcessLock, cuCheckpointProcessUnlock"), "" when none is.
inline std::string resolve_cuda_api(void *lib, CudaApi &api, EntryKind kind)
{
	std::string missing;
#define CUDA_CRIU_RESOLVE(member, function, k)                                                         \
	api.member = reinterpret_cast<decltype(api.member)>(dlsym(lib, CUDA_CRIU_SYMBOL_NAME(function))); \
	if (!api.member && EntryKind::k == kind)                                                       \
		missing += (missing.empty() ? "" : ", ") + std::string(CUDA_CRIU_SYMBOL_NAME(function));
	CUDA_CRIU_ENTRY_POINTS(CUDA_CRIU_RESOLVE)
#undef CUDA_CRIU_RESOLVE
	return missing;
}

// The names of the entry points of `kind`, in the list's order ("cuInit, cuDriverGetVersion, ...").
inline std::string entry_point_names(EntryKind kind)
{
	std::string names;
#define CUDA_CRIU_NAME(member, function, k) \
	if (EntryKind::k == kind)           \
		names += (names.empty() ? "" : ", ") + std::string(CUDA_CRIU_SYMBOL_NAME(function));
	CUDA_CRIU_ENTRY_POINTS(CUDA_CRIU_NAME)
#undef CUDA_CRIU_NAME
	return names;
}

} // namespace cuda_criu
