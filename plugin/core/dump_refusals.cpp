#include "core/dump_refusals.h"

#include <algorithm>

#include "base/format.h"
#include "base/log.h"

namespace cuda_criu {

// Seen on r580 for cuMemExportToShareableHandle (the exporter, while it keeps the fd) and for
// cudaMallocAsync pools shared with cuMemPoolExportToShareableHandle (both sides). The driver checkpoints
// such a process, but cannot restore one that imported memory (nor return it in place).
Status refuse_shared_handles(Host &host, pid_t pid, const std::vector<DeviceFd> &fds)
{
	size_t ctl = static_cast<size_t>(std::count_if(fds.begin(), fds.end(), [](const DeviceFd &f) {
		return f.path.size() >= 9 && f.path.compare(f.path.size() - 9, 9, "nvidiactl") == 0;
	}));
	bool nvml = host.uses_nvml(pid);
	size_t own = nvml ? 2 : 1;
	if (ctl <= own)
		return {};
	return make_error(EBUSY,
			  "pid %d holds %zu open /dev/nvidiactl files, %zu more than the CUDA driver%s opens: a CUDA memory "
			  "handle exported to or imported from another process as a file descriptor "
			  "(cuMemExportToShareableHandle, a cudaMallocAsync pool shared with "
			  "cuMemPoolExportToShareableHandle); the driver checkpoints such processes but cannot restore "
			  "the one that imported the memory (CUDA IPC is restored from driver r610 on), so the dump is "
			  "refused before the lock and the tree goes on running; dump it once those handles are closed",
			  pid, ctl, ctl - own, nvml ? " and NVML" : "");
}

namespace {

// Whether q is the exporter of the legacy IPC file f: the driver's exporter holds its file open, an importer
// only maps it. The fd pins the pid namespace the file's name was given in, so q's pid there (in its own,
// innermost namespace) must be the number the name carries: a process of another namespace whose pid is
// that number (a host pid equal to a container's pid) is no exporter of it, nor is a child that inherited
// the exporter's fd.
bool exports(Host &host, pid_t q, const IpcFileMapping &f)
{
	return host.task_info(q).ns_pid == f.named_pid && host.holds_file(q, f.dev, f.inode);
}

// "pid 4242", and where the process is in a pid namespace below this one, its pid and namespace there.
std::string describe_exporter(Host &host, pid_t exporter, pid_t ns_pid)
{
	if (ns_pid == exporter)
		return format("pid %d", exporter);
	std::string ns = host.pid_namespace(exporter);
	return format("pid %d (pid %d in pid namespace %s)", exporter, ns_pid, ns.empty() ? "unknown" : ns.c_str());
}

std::string pid_list(const std::vector<pid_t> &pids)
{
	std::string out;
	for (pid_t p : pids)
		out += (out.empty() ? "" : ", ") + std::to_string(p);
	return out;
}

constexpr const char *kIpcWhatToDo =
	"driver r580 checkpoints such processes but cannot restore the one that imported the memory "
	"(CUDA_ERROR_INVALID_VALUE; CUDA IPC is restored from driver r610 on), so nothing is locked and the "
	"tree goes on running. To checkpoint it: let both processes release what they share (the shared CUDA "
	"tensors, cuIpcCloseMemHandle), or checkpoint each process once it no longer shares, or run driver "
	"r610 or newer";

} // namespace

Status refuse_legacy_ipc(Host &host, pid_t pid)
{
	for (const IpcFileMapping &f : host.cuda_ipc_files(pid)) {
		std::vector<pid_t> others = host.processes_mapping(f.dev, f.inode);
		others.erase(std::remove(others.begin(), others.end(), pid), others.end());
		if (!exports(host, pid, f)) {
			auto exporter = std::find_if(others.begin(), others.end(), [&](pid_t q) { return exports(host, q, f); });
			std::string who = exporter != others.end()
						  ? describe_exporter(host, *exporter, f.named_pid)
						  : format("pid %d as its own pid namespace numbered it, which has exited (no process "
							   "that maps the file holds it open)",
							   f.named_pid);
			std::string that = exporter != others.end() ? format("pid %d", *exporter) : "the exited process";
			return make_error(EBUSY,
					  "pid %d maps %s, the legacy CUDA IPC file of %s: it opened GPU memory or an event "
					  "that %s exported (cuIpcOpenMemHandle, cuIpcOpenEventHandle; torch.multiprocessing passes CUDA "
					  "tensors that way); %s",
					  pid, f.path.c_str(), who.c_str(), that.c_str(), kIpcWhatToDo);
		}
		if (!others.empty())
			return make_error(EBUSY,
					  "pid %d exported GPU memory or an event through legacy CUDA IPC (cuIpcGetEventHandle; torch shares an "
					  "event with each CUDA tensor it passes on) and pid %s map%s its IPC file %s: %s",
					  pid, pid_list(others).c_str(), others.size() == 1 ? "s" : "", f.path.c_str(),
					  kIpcWhatToDo);
		LOG_INFO("pid %d exported GPU memory or an event through legacy CUDA IPC (%s), but no other process maps it: it "
			 "is checkpointed as a process of its own",
			 pid, f.path.c_str());
	}
	return {};
}

Status refuse_sharing(Host &host, pid_t pid)
{
	if (auto st = refuse_shared_handles(host, pid, host.nvidia_device_files(pid).fds); !st)
		return st;
	return refuse_legacy_ipc(host, pid);
}

Status refuse_streamed(Host &host, pid_t pid)
{
	for (const std::string &a : host.command_line())
		if (a == "--stream")
			return make_error(EINVAL,
					  "pid %d: criu dump --stream sends the image to the image streamer, which the CUDA "
					  "plugin's own files (GPU image, cuda-plugin.img) never reach: the image would not "
					  "restore; dump without --stream",
					  pid);
	return {};
}

// CRIU pauses a parent before its children, so the CUDA processes paused before pid include the one a
// fork gave it its files from. A process that opened its own (NVML, a library probing the GPUs) would
// lose them.
std::optional<Error> not_inherited(Host &host, pid_t pid,
				   const std::vector<std::pair<pid_t, std::vector<DeviceFd>>> &cuda_fds)
{
	for (const DeviceFd &f : host.nvidia_device_files(pid).fds) {
		bool shared = false;
		for (const auto &[cuda_pid, fds] : cuda_fds)
			for (const DeviceFd &g : fds)
				shared = shared || host.same_open_file(pid, f.fd, cuda_pid, g.fd).value_or(false);
		if (!shared)
			return make_error(EBUSY,
					  "pid %d holds the NVIDIA device file %s (fd %d) and has no CUDA state, but did not "
					  "inherit that file from a CUDA process of this dump (it opened it itself, e.g. "
					  "through NVML, or its CUDA parent is not in the dump): the driver's checkpoint cannot "
					  "save what it does with the GPU; dump the tree from its CUDA parent, or end that GPU "
					  "use before the dump",
					  pid, f.path.c_str(), f.fd);
	}
	return std::nullopt;
}

Error stand_ins_refused(pid_t pid, bool cuda_process)
{
	if (cuda_process)
		return make_error(EBUSY,
				  "pid %d still holds NVIDIA device files after its CUDA checkpoint: most likely a CUDA "
				  "memory handle exported to or imported from another process as a file descriptor "
				  "(cuMemExportToShareableHandle, a cudaMallocAsync pool shared between processes), which "
				  "the driver cannot checkpoint (CUDA IPC needs driver r610 or newer)",
				  pid);
	return make_error(EBUSY,
			  "pid %d holds NVIDIA device files but does not use CUDA (no libcuda mapped: NVML, nvidia-smi, "
			  "DCGM or another direct user of the driver): the driver's checkpoint saves CUDA processes only, "
			  "so its GPU files cannot be restored; stop it, or leave it out of the dump",
			  pid);
}

} // namespace cuda_criu
