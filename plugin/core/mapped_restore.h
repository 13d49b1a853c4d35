// Restore at page-cache speed: the driver's checkpoint leaves each process's GPU state in private
// anonymous memory, which CRIU dumps; the driver's restore reads that memory once and unmaps it. A CRIU
// with criu-patches/0002 can map those pages from the image's pages file (copy-on-write) instead of
// reading them into fresh memory, so the driver reads them straight from the page cache.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/lazy_decoded.h"
#include "image/gpu_image.h"
#include "image/record.h"
#include "os/maps.h"
#include "os/decoded_share.h"
#include "os/mem_file.h"

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

// CRIU's criu_restore_map_fd(pid, start, end, fd, offset) (criu-patches/0008): 0 or -errno. Empty on a
// CRIU without it.
using MapFd = std::function<int(int pid, uint64_t start, uint64_t end, int fd, uint64_t offset)>;

// CRIU's criu_restore_map_fd_userfault(pid) (criu-patches/0010): 0 or -errno. Empty on a CRIU without it.
using MapFdUserfault = std::function<int(int pid)>;

// What CRIU maps of a GPU image the plugin stored itself.
struct MappedGpuImage {
	std::set<int> processes; // image pids (in their namespaces) whose chunks CRIU maps; the plugin writes
				 // the others' itself, and chunks in a parent image's files always
	// Image pid -> the memory its compressed chunks are decoded into (GpuProcessChunks::decoded_offset),
	// which CRIU maps from the file the plugin holds: to be filled before the driver's restore reads it.
	std::map<int, std::shared_ptr<MemFile>> decoded;
	// Image pid -> that memory as shared with other restores of the same image (os/decoded_share.h):
	// where joined(), another restore decodes it.
	std::map<int, std::shared_ptr<DecodedShare>> shares;
	// The processes whose decoded memory CRIU registers with a userfaultfd: read by the driver while
	// it is still being decoded.
	std::shared_ptr<LazyDecoded> lazy = std::make_shared<LazyDecoded>();
};

// For an image whose GPU state the plugin stored itself: asks CRIU to map each process's stored chunks
// (merged into runs) where `enabled` and CRIU allow: raw chunks from the plugin's data files, compressed
// ones from memory they are to be decoded into (with map_fd, for a process without chunks in a parent image),
// and those on demand (userfault) where this restore decodes them.
// share_place: where concurrent restores of the same image share decoded memory (the GPU reservation
// ledger's; null: each decodes its own).
MappedGpuImage request_mapped_gpu_image(const GpuImageIndex &index, bool enabled, const MapFile &map,
					const MapFd &map_fd, const GpuLedgerPlace *share_place = nullptr,
					const MapFdUserfault &userfault = {});
std::string decoded_key(const GpuImageIndex &index, const GpuProcessChunks &p);

// After the driver restored pid: the mappings of the image's pages files (in image_dir) it still holds.
// The driver normally unmaps its copy; one it kept ties the process to the image (see docs).
std::string image_still_mapped(const std::vector<Mapping> &maps, const std::string &image_dir);

} // namespace cuda_criu
