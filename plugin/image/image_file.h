// What the plugin's image files (cuda-plugin.img, cuda-plugin-devices.img, the GPU image's index) share:
// an 8-byte magic and a 4-byte little-endian length before the protobuf data; written whole into CRIU's
// image directory and read back with a size limit, never through a symbolic link.
#pragma once

#include <protobuf-c/protobuf-c.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
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

// The bytes of a file holding msg: the header, then msg packed by protobuf-c's get_packed_size and pack.
template <typename Msg>
std::vector<uint8_t> pack_framed(const char (&magic)[8], const Msg &msg, size_t (*packed_size)(const Msg *),
				 size_t (*pack)(const Msg *, uint8_t *))
{
	std::vector<uint8_t> out = framed_buffer(magic, packed_size(&msg));
	pack(&msg, out.data() + kImageHeaderBytes);
	return out;
}

// A message protobuf-c unpacked, freed with the allocator that made it.
template <typename Msg>
using Unpacked = std::unique_ptr<Msg, std::function<void(Msg *)>>;

// The message of a file's bytes, once its header checks out (unframe): unpacked with allocator
// (nullptr: malloc), null when its data does not parse.
template <typename Msg>
Result<Unpacked<Msg>> unpack_framed(const uint8_t *data, size_t size, const char (&magic)[8], const char *what,
				    Msg *(*unpack)(ProtobufCAllocator *, size_t, const uint8_t *),
				    void (*free_unpacked)(Msg *, ProtobufCAllocator *),
				    ProtobufCAllocator *allocator = nullptr)
{
	auto len = unframe(data, size, magic, what);
	if (!len)
		return std::move(len).error();
	return Unpacked<Msg>(unpack(allocator, *len, data + kImageHeaderBytes),
			     [free_unpacked, allocator](Msg *m) { free_unpacked(m, allocator); });
}

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

// One image file of one record type: its name, its size limit and its codec; errors of its reading name
// the file.
template <typename T>
struct RecordFile {
	const char *name;
	size_t max_bytes;
	std::vector<uint8_t> (*encode)(const T &record);
	Result<T> (*decode)(const uint8_t *data, size_t size);

	Status write(int dir_fd, const T &record) const { return write_image_file(dir_fd, name, encode(record)); }
	// nullopt when the directory has no such file.
	Result<std::optional<T>> read(int dir_fd) const
	{
		auto data = read_image_file(dir_fd, name, max_bytes);
		if (!data)
			return std::move(data).error();
		if (!*data)
			return std::optional<T>();
		auto record = decode((*data)->data(), (*data)->size());
		if (!record)
			return std::move(record).error().context("%s", name);
		return std::optional<T>(std::move(*record));
	}
};

} // namespace cuda_criu
