// What a process forked after its parent initialised CUDA inherited from the NVIDIA driver: shared
// mappings of /dev/nvidiactl and /dev/nvidiaN and open /dev/nvidia* files. It has no CUDA state and can
// never use them (the driver serves only the process that opened them), and after the parent's
// checkpoint nothing else refers to them. CRIU cannot dump device files itself; the plugin claims them
// (metadata only) and the restore puts inert placeholders at the same addresses and fd numbers:
//  - a mapping becomes a mapping of /dev/zero with the same address, size, protection and MAP_SHARED
//    or MAP_PRIVATE flag (CRIU maps it from the vma entry): zero-filled anonymous memory;
//  - an open file becomes /dev/null opened with the same access mode and O_NONBLOCK/O_APPEND flags.
// See docs/forked-children.md.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>

#include "base/result.h"
#include "image/devices_image.h"
#include "os/host.h"

namespace cuda_criu {

// Dump side; lives in CRIU's process for one dump.
class InheritedDevicesDump {
public:
	// Whether a process of the tree may have its NVIDIA device files stood in for; an error names it and
	// says why not (DumpSession::stand_ins_allowed).
	using StandInCheck = std::function<Status(pid_t pid)>;
	// image_dir_fd: CRIU's image directory (CRIU owns it; it outlives this object), as host does.
	InheritedDevicesDump(Host &host, int image_dir_fd, StandInCheck allowed)
		: host_(host), dir_fd_(image_dir_fd), allowed_(std::move(allowed))
	{
	}

	// HANDLE_DEVICE_VMA: whether the mapped file fd (stat st) is an NVIDIA device file, recording it.
	Result<bool> claim_mapping(int fd, const struct stat &st);
	// DUMP_EXT_FILE: whether the open file lfd (CRIU's file id) is an NVIDIA device file, recording it.
	Result<bool> claim_file(int lfd, uint32_t id);
	bool claimed_any() const { return !record_.mapped_paths.empty() || !record_.files.empty(); }

private:
	Status save();
	// What each process CRIU dumps holds of NVIDIA device files, read from /proc once, at the first
	// claim, each holder checked by allowed_ (an error fails every claim), the list kept for `cuda-criu
	// inspect`. The hooks do not say which process a file belongs to, but CRIU has seized (ptrace) every
	// task of the tree, and checkpointed its CUDA processes, before it dumps the first one.
	Status describe_processes();

	Host &host_;
	int dir_fd_;
	StandInCheck allowed_;
	bool described_ = false;
	std::optional<Error> refusal_; // of the first claim, repeated to every later one
	InheritedDevicesRecord record_;
};

// A CUDA process must hold no device file after its checkpoint: the driver closes them. One that still
// maps one is refused (its placeholder would replace memory the restored driver state refers to).
Status check_no_device_mappings(Host &host, pid_t pid);

// Restore side: answers in CRIU and in each task it forks, from the image read by load() in CRIU
// before it forks (in a task, the image directory's fd number may already be taken by a restored fd).
class InheritedDevicesRestore {
public:
	explicit InheritedDevicesRestore(int image_dir_fd) : dir_fd_(image_dir_fd) {}

	// UPDATE_VMA_MAP: for a mapping of a device file the dump claimed, a new fd of /dev/zero to map in
	// its place (the caller owns it); std::nullopt when path is not one of ours.
	Result<std::optional<int>> mapping_fd(const char *path);
	// RESTORE_EXT_FILE: for a file the dump claimed, a new fd of /dev/null opened like the original
	// (the caller owns it); std::nullopt when id is not one of ours.
	Result<std::optional<int>> file_fd(uint32_t id);
	Status load();

private:
	int dir_fd_;
	bool loaded_ = false;
	InheritedDevicesRecord record_;
};

} // namespace cuda_criu
