// Restore at page-cache speed: the driver's checkpoint leaves each process's GPU state in private
// anonymous memory, which CRIU dumps; the driver's restore reads that memory once and unmaps it. A CRIU
// with criu-patches/0002 can map those pages from the image's pages file (copy-on-write) instead of
// reading them into fresh memory, so the driver reads them straight from the page cache.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "image/gpu_image.h"
#include "image/record.h"
#include "os/maps.h"

namespace cuda_criu {

// CRIU's criu_restore_map_from_image(pid, start, end): 0 or -errno. Empty on a CRIU without it.
using MapFromImage = std::function<int(int pid, uint64_t start, uint64_t end)>;

// Asks CRIU to map every process's checkpoint ranges from the image, where `enabled` (the map-image
// option) and CRIU allow; logs what it asked for, or why the restore reads the memory as usual.
// Returns the number of ranges asked for.
size_t request_mapped_restore(const ImageRecord &image, bool enabled, const MapFromImage &map);

// CRIU's criu_restore_map_file(pid, start, end, name, offset) (criu-patches/0005): 0 or -errno. Empty on
// a CRIU without it.
using MapFile = std::function<int(int pid, uint64_t start, uint64_t end, const char *name, uint64_t offset)>;

// For an image whose GPU state the plugin stored itself: asks CRIU to map each process's stored chunks
// (merged into runs) from the plugin's data files, where `enabled` and CRIU allow. Returns the image pids
// (in their namespaces) whose chunks are all mapped; the plugin writes the others' itself.
std::set<int> request_mapped_gpu_image(const GpuImageIndex &index, bool enabled, const MapFile &map);

// After the driver restored pid: the mappings of the image's pages files (in image_dir) it still holds.
// The driver normally unmaps its copy; one it kept ties the process to the image (see docs).
std::string image_still_mapped(const std::vector<Mapping> &maps, const std::string &image_dir);

} // namespace cuda_criu
