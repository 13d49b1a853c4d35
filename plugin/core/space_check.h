// The room preflight of a dump: an image directory that fills up mid-dump fails the dump after every
// process was locked and checkpointed (and returned). When even the least the dump must write cannot fit,
// refuse before any process is touched instead; when only the estimate does not fit, say so and dump.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/result.h"
#include "os/host.h"

namespace cuda_criu {

// What a dump writes into its image directory, as far as the plugin can tell before the first lock.
struct ImageSpaceNeed {
	size_t processes = 0;         // of the tree CRIU dumps
	size_t cuda_processes = 0;
	uint64_t ordinary_bytes = 0;  // their private anonymous memory (RssAnon): CRIU writes every page of it
	bool ordinary_is_floor = true; // false: an incremental dump may write only part of it
	uint64_t gpu_bytes = 0;       // GPU memory of the CUDA processes (NVML): what their checkpoints copy
	bool gpu_known = false;       // false: no NVML figure
	bool gpu_sparse = true;       // gpu-image=plugin: all-zero chunks and pages of it are not written
	bool pages_elsewhere = false; // the private memory goes to a page server (ordinary_bytes 0): only the
	                              // GPU image is written here
};

struct ImageSpaceEstimate {
	uint64_t floor = 0;    // the least the dump writes
	uint64_t estimate = 0; // what it writes with every GPU page (an upper estimate: no zero page left out)
};

ImageSpaceEstimate estimate_image_space(const ImageSpaceNeed &need);

struct ImageSpaceVerdict {
	Status refusal;      // ENOSPC: even the floor does not fit
	std::string warning; // the estimate does not fit, the floor does (empty: it fits)
	std::string summary; // what was compared, for the log
};

ImageSpaceVerdict check_image_space(const ImageSpaceNeed &need, const FreeSpace &space);

} // namespace cuda_criu
