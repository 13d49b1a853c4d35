// Reading and writing cuda-plugin-devices.img: the NVIDIA device files and mappings that processes
// forked after CUDA started inherited, which the restore replaces with placeholders.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace cuda_criu {

inline constexpr const char *kDevicesImageFileName = "cuda-plugin-devices.img";
inline constexpr uint32_t kDevicesImageVersion = 1;

struct InheritedFileRecord {
	uint32_t id = 0;    // CRIU's file id
	uint32_t flags = 0; // file status flags: O_ACCMODE | O_NONBLOCK | O_APPEND
	std::string path;
};

struct InheritedDevicesRecord {
	std::vector<std::string> mapped_paths;
	std::vector<InheritedFileRecord> files;
};

std::vector<uint8_t> encode_devices_image(const InheritedDevicesRecord &record);
Result<InheritedDevicesRecord> decode_devices_image(const uint8_t *data, size_t size);

// Replaces the file in dir_fd (0644, never through a symlink).
Status write_devices_image(int dir_fd, const InheritedDevicesRecord &record);
// std::nullopt when the directory has no such file.
Result<std::optional<InheritedDevicesRecord>> read_devices_image(int dir_fd);

} // namespace cuda_criu
