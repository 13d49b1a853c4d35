// The plugin's GPU image (gpu-image=plugin; docs/gpu-image.md): at dump, after the driver's checkpoint,
// the driver's copy of each process's GPU state (its checkpoint ranges) is read out of the stopped
// process by several threads, each writing its own data file; all-zero chunks are not stored and every
// stored chunk gets a CRC-32C. At restore every chunk is read back and checked before the driver's
// restore sees it, and written into the process unless CRIU maps it from the file itself.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <string>
#include <vector>

#include "base/result.h"
#include "core/lazy_decoded.h"
#include "image/gpu_image.h"
#include "image/record.h"
#include "os/host.h"

namespace cuda_criu {

struct GpuSaveTarget {
	pid_t pid = 0;
	pid_t ns_pid = 0;
	std::vector<MemoryRange> ranges; // page aligned
};

// The number of writer/reader threads for bytes of GPU state: io_threads when set, else as many as
// help (one per 64 MiB, up to 16 and to the machine's cores).
unsigned gpu_io_threads(unsigned io_threads, uint64_t bytes);

// Stores the targets' ranges into data files cuda-gpu-N.img in dir_fd (N < threads) and returns their
// index (not yet written). With a parent image, a chunk whose bytes equal one of the parent's stored
// chunks (same CRC-32C, then compared byte for byte) is referenced in the parent's file, not written.
// zstd_level > 0: each chunk compressed (image/chunk_codec.h), stored raw where that does not shrink it;
// a chunk referenced in the parent keeps the parent's encoding. On failure the data files written so far
// are removed.
Result<GpuImageIndex> save_gpu_state(Host &host, int dir_fd, const std::vector<GpuSaveTarget> &targets,
				     const std::string &id, unsigned threads, uint32_t chunk_bytes = kGpuChunkBytes,
				     const GpuParentImage *parent = nullptr, int zstd_level = 0);

// The same without data files, for a GPU state CRIU's pages images hold: every chunk (zero ones too) read
// out of its process and its CRC-32C kept, in an index with criu_pages set.
Result<GpuImageIndex> checksum_gpu_state(Host &host, const std::vector<GpuSaveTarget> &targets, const std::string &id,
					 unsigned threads, uint32_t chunk_bytes = kGpuChunkBytes);

// A restored process and its pid in the image; write: put the chunks into it (false: CRIU mapped them
// from the data files, they are only checked). decoded: its compressed chunks are decoded there (at
// GpuProcessChunks::decoded_offsets), into memory CRIU maps into the process, and never written.
struct GpuLoadTarget {
	pid_t pid = 0;
	pid_t ns_pid = 0;
	bool write = true;
	uint8_t *decoded = nullptr;
	bool skip_compressed = false; // another restore decodes them (os/decoded_share.h)
};

// Opens every data file of the index (present, whole, of this dump): the checks a restore can make
// before CRIU restores anything.
Status check_gpu_files(int dir_fd, const GpuImageIndex &index);

// Reads every stored chunk of the targets, checks its CRC-32C, and puts it into the process where the
// target says so. With a checksums-only index (criu_pages) each chunk is read from the restored process,
// as CRIU put it there, and checked. Stops at the first bad chunk, with an error naming the process, address, file and
// offset. cancel: once set, the threads stop at their next chunk and the load fails (ECANCELED). A
// target without a pid (0) is a process of the image not restored yet (or no restore at all: cuda-criu
// inspect --verify): its chunks are only read from the files and checked, never written, and errors name it
// by its pid in the image. Chunks CRIU cannot map (in a parent's file, or compressed) are written into a
// restored process even where write is false. lazy: told of each chunk decoded into memory a process maps
// (GpuLoadTarget::decoded), and asked before each chunk which one a process waits for: that one next.
Status load_gpu_state(Host &host, int dir_fd, const GpuImageIndex &index, const std::vector<GpuLoadTarget> &targets,
		      unsigned threads, const std::atomic<bool> *cancel = nullptr, LazyDecoded *lazy = nullptr);

} // namespace cuda_criu
