#include "driver/libcuda.h"

#include <dlfcn.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "base/log.h"
#include "driver/cuda_api.h"
#include "driver/nvml.h"
#include "os/fs_context.h"

namespace cuda_criu {
namespace {

using Api = CudaApi;

class LibCuda final : public Driver {
public:
	LibCuda(Api api, std::string version) : api_(api), version_(std::move(version)) {}

	Result<pid_t> restore_thread_id(pid_t pid) override
	{
		int tid = 0;
		if (auto st = check(api_.get_restore_thread_id(pid, &tid), "cuCheckpointProcessGetRestoreThreadId"); !st)
			return std::move(st).error();
		return static_cast<pid_t>(tid);
	}

	Result<CudaState> state(pid_t pid) override
	{
		CUprocessState s = CU_PROCESS_STATE_RUNNING;
		if (auto st = check(api_.get_state(pid, &s), "cuCheckpointProcessGetState"); !st)
			return std::move(st).error();
		switch (s) {
		case CU_PROCESS_STATE_RUNNING:
			return CudaState::Running;
		case CU_PROCESS_STATE_LOCKED:
			return CudaState::Locked;
		case CU_PROCESS_STATE_CHECKPOINTED:
			return CudaState::Checkpointed;
		case CU_PROCESS_STATE_FAILED:
			return CudaState::Failed;
		}
		return make_error(EIO, "cuCheckpointProcessGetState returned unknown state %d", static_cast<int>(s));
	}

	Status lock(pid_t pid, unsigned timeout_ms) override
	{
		CUcheckpointLockArgs args{};
		args.timeoutMs = timeout_ms;
		return check(api_.lock(pid, &args), "cuCheckpointProcessLock");
	}

	Status checkpoint(pid_t pid) override
	{
		CUcheckpointCheckpointArgs args{};
		CUresult res = api_.checkpoint(pid, &args);
		Status st = check(res, "cuCheckpointProcessCheckpoint");
		if (res == CUDA_ERROR_NOT_SUPPORTED)
			return make_error(EIO,
					  "the NVIDIA driver cannot checkpoint this process: it uses CUDA managed memory "
					  "(cudaMallocManaged / cuMemAllocManaged), or another feature the driver's checkpoint "
					  "does not support (an MPS client, for one); "
					  "free that memory before the dump, or leave the process out (%s)",
					  st.error().message().c_str());
		return st;
	}

	Status restore(pid_t pid, const std::vector<GpuPair> &pairs) override
	{
		std::vector<CUcheckpointGpuPair> cu_pairs(pairs.size());
		for (size_t i = 0; i < pairs.size(); i++) {
			std::copy(pairs[i].from.bytes.begin(), pairs[i].from.bytes.end(), cu_pairs[i].oldUuid.bytes);
			std::copy(pairs[i].to.bytes.begin(), pairs[i].to.bytes.end(), cu_pairs[i].newUuid.bytes);
		}
		CUcheckpointRestoreArgs args{};
		if (!cu_pairs.empty()) {
			args.gpuPairs = cu_pairs.data(); // borrowed for the duration of the call
			args.gpuPairsCount = static_cast<unsigned>(cu_pairs.size());
		}
		CUresult res = api_.restore(pid, &args);
		Status st = check(res, "cuCheckpointProcessRestore");
		// Measured on r580 (580.159.04): a process that imported memory of another process is checkpointed,
		// but its restore fails, and it stays checkpointed for good (an unlock is CUDA_ERROR_ILLEGAL_STATE).
		// NVIDIA's cuda-checkpoint restores CUDA IPC from driver r610 on.
		constexpr const char *kIpc = "CUDA IPC memory the process imported from another process "
					     "(cuIpcOpenMemHandle): only driver r610 or newer restores it";
		constexpr const char *kJax = "contexts on several GPUs, which r580 does not restore for JAX: run it on "
					     "one GPU per process";
		if (res == CUDA_ERROR_INVALID_VALUE && !pairs.empty())
			return make_error(EIO,
					  "%s (with %zu GPU pair(s); known causes: (1) the pairing: the driver wants every GPU "
					  "the process's driver knew paired, and no other: on a host also GPUs hidden by "
					  "CUDA_VISIBLE_DEVICES, in a container only those of its /dev; each onto a GPU of the "
					  "same model; (2) %s; (3) %s)",
					  st.error().message().c_str(), pairs.size(), kIpc, kJax);
		if (res == CUDA_ERROR_INVALID_VALUE)
			return make_error(EIO,
					  "%s (the driver refuses to restore this process even onto the GPUs it was "
					  "checkpointed on; known causes: (1) %s; (2) %s)",
					  st.error().message().c_str(), kIpc, kJax);
		if (res == CUDA_ERROR_NOT_SUPPORTED)
			return make_error(EIO,
					  "%s (a known cause: memory the process imported from another process through a "
					  "shareable handle (cuMemImportFromShareableHandle), which r580 does not restore)",
					  st.error().message().c_str());
		if (res == CUDA_ERROR_OPERATING_SYSTEM)
			return make_error(EIO,
					  "%s (a known cause: a cudaMallocAsync memory pool the process imported from "
					  "another process (cuMemPoolImportFromShareableHandle), which r580 does not restore)",
					  st.error().message().c_str());
		return st;
	}

	Status unlock(pid_t pid) override
	{
		CUcheckpointUnlockArgs args{};
		return check(api_.unlock(pid, &args), "cuCheckpointProcessUnlock");
	}

	std::string version() const override { return version_; }

	uint64_t free_bytes(const GpuUuid &uuid) override { return nvml_free_bytes(uuid); }
	std::optional<std::map<pid_t, uint64_t>> gpu_bytes_by_process() override { return nvml_gpu_bytes_by_process(); }
	std::optional<std::map<pid_t, uint64_t>> gpu_bytes_on(const GpuUuid &uuid) override { return nvml_gpu_bytes_on(uuid); }
	std::optional<std::map<pid_t, std::vector<GpuUuid>>> gpus_by_process() override { return nvml_gpus_by_process(); }

	Result<std::vector<GpuInfo>> gpus() override
	{
		if (!api_.device_get_count || !api_.device_get || !api_.device_get_uuid)
			// Not ENOTSUP: CRIU reads that as "not my process" and would go on without us.
			return make_error(ENOSYS, "the driver library lacks the device query functions");
		int count = 0;
		if (auto st = check(api_.device_get_count(&count), "cuDeviceGetCount"); !st)
			return std::move(st).error();
		std::vector<GpuInfo> out;
		for (int i = 0; i < count; i++) {
			CUdevice dev = 0;
			if (auto st = check(api_.device_get(&dev, i), "cuDeviceGet"); !st)
				return std::move(st).error();
			GpuInfo info;
			info.ordinal = i;
			CUuuid uuid{};
			if (auto st = check(api_.device_get_uuid(&uuid, dev), "cuDeviceGetUuid"); !st)
				return std::move(st).error();
			std::copy(std::begin(uuid.bytes), std::end(uuid.bytes), info.uuid.bytes.begin());
			char buf[256] = {};
			if (api_.device_get_name && api_.device_get_name(buf, sizeof(buf) - 1, dev) == CUDA_SUCCESS)
				info.name = buf;
			size_t mem = 0;
			if (api_.device_total_mem && api_.device_total_mem(&mem, dev) == CUDA_SUCCESS)
				info.memory_bytes = mem;
			char bus[64] = {};
			if (api_.device_get_pci_bus_id && api_.device_get_pci_bus_id(bus, sizeof(bus) - 1, dev) == CUDA_SUCCESS) {
				info.pci_bus_id = bus;
				for (auto &c : info.pci_bus_id)
					c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
			}
			out.push_back(std::move(info));
		}
		return out;
	}

	// "cuCheckpointProcessLock failed: CUDA_ERROR_TIMEOUT (909): the operation timed out"
	Status check(CUresult res, const char *call) const
	{
		if (res == CUDA_SUCCESS)
			return {};
		const char *name = nullptr;
		const char *text = nullptr;
		if (api_.get_error_name(res, &name) != CUDA_SUCCESS || !name)
			name = "CUDA_ERROR_UNKNOWN_CODE";
		if (api_.get_error_string(res, &text) != CUDA_SUCCESS || !text)
			text = "no description";
		int err = EIO;
		if (res == CUDA_ERROR_TIMEOUT)
			err = ETIMEDOUT;
		else if (res == CUDA_ERROR_NOT_INITIALIZED)
			err = kNoCudaState;
		else if (res == CUDA_ERROR_ILLEGAL_STATE)
			err = kWrongState;
		return make_error(err, "%s failed: %s (%d): %s", call, name, static_cast<int>(res), text);
	}

private:
	Api api_;
	std::string version_;
};

Result<Driver *> load_once(const std::string &path)
{
	auto lib = open_libcuda(path);
	if (!lib)
		return make_error(ENOENT, "%s (install the NVIDIA driver, or set CUDA_CRIU_LIBCUDA to the path of libcuda.so.1)",
				  lib.error().message().c_str());
	const char *file = lib->file.c_str();
	Api api;
	// A library without an entry point fails with ENOSYS, never ENOTSUP: CRIU reads -ENOTSUP from a hook
	// as "not my process" and would dump the CUDA process without its GPU state.
	if (std::string missing = resolve_cuda_api(lib->handle, api, EntryKind::Basic); !missing.empty())
		return make_error(ENOSYS, "%s is not a usable CUDA driver library: missing %s", file, missing.c_str());
	std::string version = kernel_driver_version();
	const std::string &cuda = lib->cuda_version;
	if (version.empty())
		version = "CUDA " + cuda;
	if (std::string missing = resolve_cuda_api(lib->handle, api, EntryKind::Checkpoint); !missing.empty())
		return make_error(ENOSYS,
				  "NVIDIA driver %s (CUDA %s, %s) has no checkpoint API (missing %s): CUDA "
				  "checkpoint/restore needs driver r570 or newer; upgrade the driver",
				  version.c_str(), cuda.c_str(), file, missing.c_str());

	CUresult res = CUDA_ERROR_UNKNOWN;
	run_with_own_fs([&] { res = api.init(0); });
	if (res != CUDA_SUCCESS) {
		const char *name = nullptr;
		api.get_error_name(res, &name);
		return make_error(EIO, "cuInit failed: %s (%d) (driver %s): is the NVIDIA kernel module loaded?",
				  name ? name : "?", static_cast<int>(res), version.c_str());
	}
	LOG_DEBUG("loaded %s: NVIDIA driver %s, CUDA %s", file, version.rfind("CUDA", 0) == 0 ? "unknown" : version.c_str(),
		  cuda.c_str());
	return static_cast<Driver *>(new LibCuda(api, version)); // lives as long as the process
}

} // namespace

Result<Driver *> load_libcuda(const std::string &path)
{
	static std::once_flag once;
	static Result<Driver *> loaded = make_error(EINVAL, "not loaded");
	std::call_once(once, [&] { loaded = load_once(path); });
	return loaded;
}

Result<LibcudaFile> open_libcuda(const std::string &path)
{
	const char *file = path.empty() ? "libcuda.so.1" : path.c_str();
	// RTLD_NODELETE: the library starts threads in cuInit; it must never be unmapped under them.
	void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!lib) {
		const char *why = dlerror();
		return make_error(ENOENT, "cannot load %s: %s", file, why ? why : "unknown error");
	}
	LibcudaFile out;
	out.handle = lib;
	out.file = file;
	link_map *lm = nullptr;
	if (dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name) {
		char real[PATH_MAX];
		out.file = realpath(lm->l_name, real) ? real : lm->l_name;
	}
	auto get_version = reinterpret_cast<decltype(&::cuDriverGetVersion)>(
		dlsym(lib, CUDA_CRIU_SYMBOL_NAME(cuDriverGetVersion)));
	int v = 0;
	if (get_version && get_version(&v) == CUDA_SUCCESS)
		out.cuda_version = cuda_version_text(v);
	return out;
}

std::string cuda_version_text(int version) { return format("%d.%d", version / 1000, (version % 1000) / 10); }

} // namespace cuda_criu
