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

} // namespace cuda_criu
