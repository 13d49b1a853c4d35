#include "driver/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "base/log.h"
#include "os/fs_context.h"

namespace cuda_criu {
namespace {

// The few NVML declarations used, as nvml.h has them (stable ABI; the header is not needed to build).
using NvmlReturn = int; // nvmlReturn_t, 0 = NVML_SUCCESS
using NvmlDevice = struct NvmlDeviceOpaque *;
struct NvmlMemory {
	unsigned long long total, free, used; // nvmlMemory_t
};

struct NvmlProcessInfo {
	unsigned pid;
	unsigned long long used_gpu_memory; // nvmlProcessInfo_t (v2 and v3)
	unsigned gpu_instance_id, compute_instance_id;
};

struct Nvml {
	NvmlReturn (*init)() = nullptr;
	NvmlReturn (*count)(unsigned *) = nullptr;
	NvmlReturn (*by_index)(unsigned, NvmlDevice *) = nullptr;
	NvmlReturn (*processes)(NvmlDevice, unsigned *, NvmlProcessInfo *) = nullptr; // optional
	NvmlReturn (*by_uuid)(const char *, NvmlDevice *) = nullptr;
	NvmlReturn (*memory)(NvmlDevice, NvmlMemory *) = nullptr;
	NvmlReturn (*persistence)(NvmlDevice, int *) = nullptr; // nvmlEnableState_t: 1 = enabled
	NvmlReturn (*uuid)(NvmlDevice, char *, unsigned) = nullptr; // optional
};

const Nvml *load_once()
{
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!lib) {
		LOG_DEBUG("no NVML (%s): free GPU memory is not checked before a restore", dlerror());
		return nullptr;
	}
	static Nvml api;
	api.init = reinterpret_cast<decltype(api.init)>(dlsym(lib, "nvmlInit_v2"));
	api.by_uuid = reinterpret_cast<decltype(api.by_uuid)>(dlsym(lib, "nvmlDeviceGetHandleByUUID"));
	api.memory = reinterpret_cast<decltype(api.memory)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
	api.persistence = reinterpret_cast<decltype(api.persistence)>(dlsym(lib, "nvmlDeviceGetPersistenceMode"));
	api.count = reinterpret_cast<decltype(api.count)>(dlsym(lib, "nvmlDeviceGetCount_v2"));
	api.by_index = reinterpret_cast<decltype(api.by_index)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
	api.processes =
		reinterpret_cast<decltype(api.processes)>(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
	api.uuid = reinterpret_cast<decltype(api.uuid)>(dlsym(lib, "nvmlDeviceGetUUID"));
	if (!api.init || !api.by_uuid || !api.memory) {
		LOG_DEBUG("%s", "libnvidia-ml.so.1 lacks the functions used: free GPU memory is not checked");
		return nullptr;
	}
	NvmlReturn res = -1;
	run_with_own_fs([&] { res = api.init(); });
	if (res != 0) {
		LOG_DEBUG("nvmlInit_v2 failed (%d): free GPU memory is not checked", res);
		return nullptr;
	}
	return &api;
}

const Nvml *nvml()
{
	static std::once_flag once;
	static const Nvml *api = nullptr;
	std::call_once(once, [] { api = load_once(); });
	return api;
}

NvmlDevice device(const Nvml *api, const GpuUuid &uuid)
{
	NvmlDevice dev = nullptr;
	return api && api->by_uuid(uuid.str().c_str(), &dev) == 0 ? dev : nullptr;
}

} // namespace

bool load_nvml() { return nvml() != nullptr; }

uint64_t nvml_free_bytes(const GpuUuid &uuid)
{
	const Nvml *api = nvml();
	NvmlMemory mem{};
	NvmlDevice dev = device(api, uuid);
	if (!dev || api->memory(dev, &mem) != 0)
		return 0;
	return mem.free;
}

std::optional<bool> nvml_persistence_mode(const GpuUuid &uuid)
{
	const Nvml *api = nvml();
	NvmlDevice dev = device(api, uuid);
	int mode = 0;
	if (!dev || !api->persistence || api->persistence(dev, &mode) != 0)
		return std::nullopt;
	return mode == 1;
}

namespace {

// The compute processes of one GPU; nullopt when NVML cannot tell.
std::optional<std::vector<NvmlProcessInfo>> device_processes(const Nvml *api, NvmlDevice dev)
{
	if (!api || !api->processes || !dev)
		return std::nullopt;
	std::vector<NvmlProcessInfo> infos(64);
	unsigned n = static_cast<unsigned>(infos.size());
	NvmlReturn r = api->processes(dev, &n, infos.data());
	if (r == 7) { // NVML_ERROR_INSUFFICIENT_SIZE: n says how many
		infos.resize(n + 16);
		n = static_cast<unsigned>(infos.size());
		r = api->processes(dev, &n, infos.data());
	}
	if (r != 0)
		return std::nullopt;
	infos.resize(std::min<size_t>(n, infos.size()));
	return infos;
}

// Calls each(device, its compute processes) for every GPU NVML knows; false when NVML cannot tell.
template <typename Each>
bool for_each_device_processes(const Nvml *api, Each each)
{
	unsigned devices = 0;
	if (!api || !api->count || !api->by_index || api->count(&devices) != 0)
		return false;
	for (unsigned d = 0; d < devices; d++) {
		NvmlDevice dev = nullptr;
		if (api->by_index(d, &dev) != 0)
			return false;
		auto infos = device_processes(api, dev);
		if (!infos || !each(dev, *infos))
			return false;
	}
	return true;
}

// Adds the memory of each process in infos that NVML tells of to out; false where it does not tell of one
// (NVML_VALUE_NOT_AVAILABLE: no permission, say).
bool add_bytes(const std::vector<NvmlProcessInfo> &infos, std::map<pid_t, uint64_t> &out)
{
	bool all = true;
	for (const NvmlProcessInfo &p : infos) {
		if (p.used_gpu_memory == ~0ULL)
			all = false;
		else
			out[static_cast<pid_t>(p.pid)] += p.used_gpu_memory;
	}
	return all;
}

} // namespace

std::optional<std::map<pid_t, uint64_t>> nvml_gpu_bytes_by_process()
{
	std::map<pid_t, uint64_t> out;
	bool ok = for_each_device_processes(nvml(), [&](NvmlDevice, const std::vector<NvmlProcessInfo> &infos) {
		return add_bytes(infos, out);
	});
	return ok ? std::optional(std::move(out)) : std::nullopt;
}

std::optional<std::map<pid_t, uint64_t>> nvml_gpu_bytes_on(const GpuUuid &uuid)
{
	const Nvml *api = nvml();
	auto infos = device_processes(api, device(api, uuid));
	if (!infos)
		return std::nullopt;
	std::map<pid_t, uint64_t> out;
	add_bytes(*infos, out); // a process NVML does not tell of stays out, as unknown
	return out;
}

std::optional<std::map<pid_t, std::vector<GpuUuid>>> nvml_gpus_by_process()
{
	const Nvml *api = nvml();
	std::map<pid_t, std::vector<GpuUuid>> out;
	bool ok = api && api->uuid &&
		  for_each_device_processes(api, [&](NvmlDevice dev, const std::vector<NvmlProcessInfo> &infos) {
			  char text[96] = {};
			  if (api->uuid(dev, text, sizeof(text) - 1) != 0)
				  return false;
			  auto uuid = GpuUuid::parse(text);
			  if (!uuid)
				  return false;
			  for (const NvmlProcessInfo &p : infos)
				  out[static_cast<pid_t>(p.pid)].push_back(*uuid);
			  return true;
		  });
	return ok ? std::optional(std::move(out)) : std::nullopt;
}

} // namespace cuda_criu
