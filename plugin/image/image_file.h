// What the plugin's two image files (cuda-plugin.img, cuda-plugin-devices.img) share: an 8-byte magic
// and a 4-byte little-endian length before the protobuf data; written whole into CRIU's image directory
// and read back with a size limit, never through a symbolic link.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <optional>
#include <vector>

#include "base/result.h"

namespace cuda_criu {

inline constexpr size_t kImageHeaderBytes = 12;

// A buffer of kImageHeaderBytes + len bytes with the header filled in: the caller packs len bytes of
// data after it.
std::vector<uint8_t> framed_buffer(const char (&magic)[8], size_t len);

// The length of the data after the header, once magic and the recorded length check out; what names
// the kind of file in errors ("image", "devices image").
Result<size_t> unframe(const uint8_t *data, size_t size, const char (&magic)[8], const char *what);

// protobuf-c keeps pointers into these strings; they must outlive the pack call.
struct PackedStrings {
	std::vector<std::unique_ptr<char[]>> strings;
	char *keep(const std::string &s);
};

// The protobuf decoder's allocations, counted: a hostile file that would make it allocate more than
// limit bytes fails to parse instead. Use as ProtobufCAllocator{alloc, release, &budget}.
struct DecodeBudget {
	size_t limit;
	size_t used = 0;
	bool exhausted = false;
	static void *alloc(void *data, size_t size);
	static void release(void *data, void *p);
};

// Creates (or truncates) name in the directory dir_fd and writes bytes to it (not synced, like CRIU's
// own images).
Status write_image_file(int dir_fd, const char *name, const std::vector<uint8_t> &bytes);

// The contents of name in dir_fd; nullopt when it does not exist. Refuses a symbolic link, anything but
// a regular file, and a file over max_bytes.
Result<std::optional<std::vector<uint8_t>>> read_image_file(int dir_fd, const char *name, size_t max_bytes);

} // namespace cuda_criu
