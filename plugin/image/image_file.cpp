#include "image/image_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "os/unique_fd.h"

namespace cuda_criu {

std::vector<uint8_t> framed_buffer(const char (&magic)[8], size_t len)
{
	std::vector<uint8_t> out(kImageHeaderBytes + len);
	std::memcpy(out.data(), magic, sizeof(magic));
	for (size_t i = 0; i < 4; i++)
		out[sizeof(magic) + i] = static_cast<uint8_t>(len >> (8 * i));
	return out;
}

Result<size_t> unframe(const uint8_t *data, size_t size, const char (&magic)[8], const char *what)
{
	if (size < kImageHeaderBytes)
		return make_error(EINVAL, "truncated %s: %zu bytes, shorter than its %zu-byte header", what, size,
				  kImageHeaderBytes);
	if (std::memcmp(data, magic, sizeof(magic)) != 0)
		return make_error(EINVAL, "not a cuda_plugin %s (bad magic): the file is corrupt or of another kind", what);
	uint32_t len = 0;
	for (size_t i = 0; i < 4; i++)
		len |= static_cast<uint32_t>(data[sizeof(magic) + i]) << (8 * i);
	if (len != size - kImageHeaderBytes)
		return make_error(EINVAL, "truncated or padded %s: header says %u bytes of data, file has %zu", what, len,
				  size - kImageHeaderBytes);
	return static_cast<size_t>(len);
}

char *PackedStrings::keep(const std::string &s)
{
	strings.emplace_back(new char[s.size() + 1]);
	std::memcpy(strings.back().get(), s.c_str(), s.size() + 1);
	return strings.back().get();
}

void *DecodeBudget::alloc(void *data, size_t size)
{
	auto *b = static_cast<DecodeBudget *>(data);
	if (size > b->limit - b->used) {
		b->exhausted = true;
		return nullptr;
	}
	b->used += size;
	return std::malloc(size);
}

void DecodeBudget::release(void *, void *p) { std::free(p); }

Status write_image_file(int dir_fd, const char *name, const std::vector<uint8_t> &bytes)
{
	UniqueFd fd(openat(dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
	if (!fd.valid())
		return errno_error("create %s in the image directory", name);
	size_t off = 0;
	while (off < bytes.size()) {
		ssize_t n = write(fd.get(), bytes.data() + off, bytes.size() - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return errno_error("write %s", name);
		off += static_cast<size_t>(n);
	}
	// Not synced, as CRIU syncs none of its images: on the GPU machine an fsync here, right after the GPU
	// image's 16 GB went into the page cache, took 0.7-1.0 s (the file system's journal commit).
	return {};
}

Result<std::optional<std::vector<uint8_t>>> read_image_file(int dir_fd, const char *name, size_t max_bytes)
{
	using Bytes = std::optional<std::vector<uint8_t>>;
	UniqueFd fd(openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
	if (!fd.valid()) {
		if (errno == ENOENT)
			return Bytes();
		if (errno == ELOOP)
			return make_error(ELOOP, "%s is a symbolic link: refusing to follow it", name);
		return errno_error("open %s", name);
	}
	struct stat st;
	if (fstat(fd.get(), &st) != 0)
		return errno_error("stat %s", name);
	if (!S_ISREG(st.st_mode))
		return make_error(EINVAL, "%s is not a regular file", name);
	if (static_cast<uint64_t>(st.st_size) > max_bytes)
		return make_error(EFBIG, "%s is %lld bytes, more than any image this plugin writes (%zu): corrupt?", name,
				  static_cast<long long>(st.st_size), max_bytes);
	std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
	size_t off = 0;
	while (off < data.size()) {
		ssize_t n = read(fd.get(), data.data() + off, data.size() - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno_error("read %s", name);
		if (n == 0)
			break;
		off += static_cast<size_t>(n);
	}
	data.resize(off);
	return Bytes(std::move(data));
}

} // namespace cuda_criu
