// Reading and writing cuda-plugin.img.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "image/record.h"

namespace cuda_criu {

inline constexpr const char *kImageFileName = "cuda-plugin.img";
// The plugin's name (CR_PLUGIN_DESC), which the dump lists in CRIU's inventory: a restore of an image
// without it has nothing of ours.
inline constexpr const char *kPluginName = "cuda_plugin";
// 2: the GPU state is in the plugin's own files (ImageRecord::gpu_image_id); 1 otherwise.
inline constexpr uint32_t kImageVersion = 2;
inline constexpr size_t kImageMaxBytes = 4 << 20; // far above any real image; bounds what a hostile one costs

// What one machine can hold, so that an image costs memory and log lines in proportion to a real dump,
// not to what its bytes can name. A CUDA process holds a context of a few hundred MiB of GPU memory:
// 64 GPUs of 141 GiB hold fewer than 40,000 of them.
inline constexpr size_t kImageMaxProcesses = 65536;
inline constexpr size_t kImageMaxGpus = 64;          // per GPU list, and per process
inline constexpr size_t kImageMaxStringBytes = 256;  // names, versions, UUIDs, host name
inline constexpr size_t kImageMaxFilePageRanges = 65536; // what a dump notes of all processes' file pages
inline constexpr size_t kImageDecodeBudget = 32 << 20; // what the protobuf decoder may allocate

// Bytes of a complete image file for record (version is set to kImageVersion).
std::vector<uint8_t> encode_image(const ImageRecord &record);
// Parses a complete image file; every malformed input is an error that says what is wrong.
Result<ImageRecord> decode_image(const uint8_t *data, size_t size);

// Writes the image into the directory dir_fd (0644, like CRIU's images; never through a symlink).
Status write_image(int dir_fd, const ImageRecord &record);
// Reads it; std::nullopt when the directory has no such file (an image of CRIU's own CUDA plugin).
Result<std::optional<ImageRecord>> read_image(int dir_fd);

} // namespace cuda_criu
