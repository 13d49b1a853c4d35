#include "driver/nvml.h"

#include <dlfcn.h>
#include <sched.h>

#include <thread>

#include "base/log.h"

namespace cuda_criu {
namespace {

// The few NVML declarations used here (a stable C ABI; nvml.h is not needed to build).
using NvmlDevice = struct NvmlDeviceOpaque *;
struct NvmlProcessInfo { // nvmlProcessInfo_t as the _v2 and _v3 functions fill it
	unsigned int pid;
	unsigned long long used_gpu_memory;
	unsigned int gpu_instance_id;
	unsigned int compute_instance_id;
};
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlInsufficientSize = 7;

} // namespace

namespace {
std::optional<std::map<pid_t, std::vector<std::string>>> query()
{
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!lib)
		return std::nullopt;
	auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
	auto count_fn = reinterpret_cast<int (*)(unsigned *)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
	auto handle_fn = reinterpret_cast<int (*)(unsigned, NvmlDevice *)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
	auto uuid_fn = reinterpret_cast<int (*)(NvmlDevice, char *, unsigned)>(dlsym(lib, "nvmlDeviceGetUUID"));
	auto procs_fn = reinterpret_cast<int (*)(NvmlDevice, unsigned *, NvmlProcessInfo *)>(
		dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
	if (!procs_fn)
		procs_fn = reinterpret_cast<int (*)(NvmlDevice, unsigned *, NvmlProcessInfo *)>(
			dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2"));
	unsigned n = 0;
	if (!init || !count_fn || !handle_fn || !uuid_fn || !procs_fn || init() != kNvmlSuccess ||
	    count_fn(&n) != kNvmlSuccess) {
		LOG_DEBUG("NVML is not usable: GPUs in use are found from open device files");
		return std::nullopt;
	}
	std::map<pid_t, std::vector<std::string>> out;
	for (unsigned i = 0; i < n; i++) {
		NvmlDevice dev = nullptr;
		char uuid[96] = {};
		if (handle_fn(i, &dev) != kNvmlSuccess || uuid_fn(dev, uuid, sizeof(uuid) - 1) != kNvmlSuccess)
			return std::nullopt;
		std::vector<NvmlProcessInfo> infos(64);
		unsigned count = static_cast<unsigned>(infos.size());
		int r = procs_fn(dev, &count, infos.data());
		if (r == kNvmlInsufficientSize) {
			infos.resize(count + 16);
			count = static_cast<unsigned>(infos.size());
			r = procs_fn(dev, &count, infos.data());
		}
		if (r != kNvmlSuccess)
			return std::nullopt;
		for (unsigned k = 0; k < count && k < infos.size(); k++)
			out[static_cast<pid_t>(infos[k].pid)].push_back(uuid);
	}
	return out;
}
} // namespace

std::optional<std::map<pid_t, std::vector<std::string>>> nvml_gpu_processes()
{
	// Like cuInit (driver/libcuda.cpp): whatever threads NVML starts must not share CRIU's fs context,
	// or CRIU cannot enter a container's mount namespace afterwards.
	std::optional<std::map<pid_t, std::vector<std::string>>> out;
	std::thread([&] {
		unshare(CLONE_FS);
		out = query();
	}).join();
	return out;
}

} // namespace cuda_criu
