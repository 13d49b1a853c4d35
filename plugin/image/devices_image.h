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

// What one process held at dump, as /proc showed it: for `cuda-criu inspect` only.
struct InheritedMappingRecord {
	uint64_t start = 0, end = 0, offset = 0;
	std::string perms; // "rw-s"
	std::string path;
};
struct InheritedFdRecord {
	int32_t fd = 0;
	uint32_t flags = 0; // as in /proc/PID/fdinfo, O_CLOEXEC included
	std::string path;
};
struct InheritedProcessRecord {
	int32_t pid = 0;    // as CRIU saw it
	int32_t ns_pid = 0; // in its own pid namespace; 0 when unknown
	std::vector<InheritedMappingRecord> mappings;
	std::vector<InheritedFdRecord> fds;
};

struct InheritedDevicesRecord {
	std::vector<std::string> mapped_paths;
	std::vector<InheritedFileRecord> files;
	std::vector<InheritedProcessRecord> processes; // empty in images of older plugins
};

std::vector<uint8_t> encode_devices_image(const InheritedDevicesRecord &record);
Result<InheritedDevicesRecord> decode_devices_image(const uint8_t *data, size_t size);

// Replaces the file in dir_fd (0644, never through a symlink).
Status write_devices_image(int dir_fd, const InheritedDevicesRecord &record);
// std::nullopt when the directory has no such file.
Result<std::optional<InheritedDevicesRecord>> read_devices_image(int dir_fd);

} // namespace cuda_criu
