// Reading /proc/PID/maps: which memory the driver's checkpoint added to a process (its copy of the GPU
// state), and which mappings of the image's pages files a restored process still holds.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/memory_range.h"
#include "base/result.h"

namespace cuda_criu {

// One line of /proc/PID/maps.
struct Mapping {
	uint64_t start = 0, end = 0;
	std::string perms; // "rw-p"
	uint64_t inode = 0;
	std::string path; // empty for anonymous memory; "[heap]", "[anon:name]", a file's path
	std::string dev;  // the file's device, "fe:01"
	uint64_t offset = 0; // in the file mapped
	bool private_anon() const;
};

std::vector<Mapping> parse_maps(std::string_view text);
Result<std::vector<Mapping>> read_maps(pid_t pid);

// Readable private anonymous memory in `after` that no mapping covered in `before`: what a call between the
// two snapshots mapped anew. Memory that appeared next to a new inaccessible (PROT_NONE) mapping is left
// out: that is a reservation filled step by step (a malloc arena, a thread stack and its guard) whose
// memory is reused after being freed rather than unmapped. Sorted, adjacent ranges merged.
std::vector<MemoryRange> added_private_anon(const std::vector<Mapping> &before, const std::vector<Mapping> &after);

uint64_t total_bytes(const std::vector<MemoryRange> &ranges);

// Mappings in `maps` of the image's pages files in the directory dir: CRIU's pages-N.img and the
// plugin's cuda-gpu-N.img.
std::vector<Mapping> pages_image_mappings(const std::vector<Mapping> &maps, const std::string &dir);

// A mapping of one of the driver's legacy CUDA IPC files: /dev/shm/cuda.shm.0.<pid in hex>.<n>. On r580
// the driver creates one when a process exports GPU memory with cuIpcGetMemHandle (torch's
// _share_cuda_), named by the exporter's pid (as it sees it, in its pid namespace) and mapped shared by it;
// each process that opens one of its handles (cuIpcOpenMemHandle) maps the exporter's file too.
struct IpcFileMapping {
	std::string path; // as the process sees it, " (deleted)" left out
	std::string dev;  // with inode: the file, whatever its path in another mount namespace
	uint64_t inode = 0;
	pid_t named_pid = 0; // the pid its name carries: its exporter's, in the exporter's pid namespace
};

// The legacy CUDA IPC files among maps, each file once.
std::vector<IpcFileMapping> cuda_ipc_files(const std::vector<Mapping> &maps);

} // namespace cuda_criu
