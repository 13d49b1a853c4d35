// What a dump refuses before it locks anything, and why: processes the driver would checkpoint into an
// image that cannot restore, or whose GPU use its checkpoint cannot save. Each refusal names the process,
// what it holds and what to do; the tree then runs on untouched. The dump (core/dump_session.h) asks these
// at each pause; cuda-criu asks refuse_sharing before a suspend and shows it in ps and check.
#pragma once

#include <sys/types.h>

#include <optional>
#include <vector>

#include "base/result.h"
#include "os/host.h"

namespace cuda_criu {

// A CUDA memory handle exported to or imported from another process as a file descriptor: an open
// /dev/nvidiactl beyond the driver's own one (and NVML's one, where NVML is loaded). fds: pid's NVIDIA
// device files.
Status refuse_shared_handles(Host &host, pid_t pid, const std::vector<DeviceFd> &fds);

// Legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle; torch.multiprocessing's CUDA tensors), seen in
// the driver's files in /dev/shm (os/maps.h): an importer (it maps a file it is not the exporter of), or an
// exporter whose file another live process maps. The exporter of a file is the process that holds it open
// and whose pid in its own pid namespace is the one the file's name carries. An exporter alone is let
// through (logged).
Status refuse_legacy_ipc(Host &host, pid_t pid);

// Both of the above: what makes pid a process the driver checkpoints but cannot restore.
Status refuse_sharing(Host &host, pid_t pid);

// criu dump --stream: the plugin's own files would never reach the image streamer.
Status refuse_streamed(Host &host, pid_t pid);

// The NVIDIA device files a process without CUDA state holds (libcuda loaded, no context: a worker forked
// from a CUDA process) may be replaced by inert stand-ins only if each is one open file with a device
// file of a CUDA process of the dump (a fork gave it). cuda_fds: each CUDA process paused so far and its
// device files. The reason they may not, or nullopt.
std::optional<Error> not_inherited(Host &host, pid_t pid,
				   const std::vector<std::pair<pid_t, std::vector<DeviceFd>>> &cuda_fds);

// Why a process holding NVIDIA device files cannot have them stood in for: a CUDA process that still
// holds some after its checkpoint, or one without libcuda (NVML alone).
Error stand_ins_refused(pid_t pid, bool cuda_process);

} // namespace cuda_criu
