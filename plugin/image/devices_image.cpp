#include "image/devices_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "cuda_plugin.pb-c.h"
#include "os/unique_fd.h"

namespace cuda_criu {
namespace {

constexpr char kMagic[8] = {'C', 'U', 'D', 'A', 'D', 'E', 'V', 'S'};
constexpr size_t kHeader = sizeof(kMagic) + 4;
constexpr size_t kMaxBytes = 4 << 20;

} // namespace

std::vector<uint8_t> encode_devices_image(const InheritedDevicesRecord &record)
{
	// protobuf-c points into these; they live until the pack below.
	std::vector<char *> paths;
	for (const auto &p : record.mapped_paths)
		paths.push_back(const_cast<char *>(p.c_str()));
	std::vector<CudaInheritedFile> files(record.files.size());
	std::vector<CudaInheritedFile *> file_ptrs;
	for (size_t i = 0; i < record.files.size(); i++) {
		cuda_inherited_file__init(&files[i]);
		files[i].id = record.files[i].id;
		files[i].has_flags = true;
		files[i].flags = record.files[i].flags;
		files[i].path = const_cast<char *>(record.files[i].path.c_str());
		file_ptrs.push_back(&files[i]);
	}
	CudaInheritedDevices msg;
	cuda_inherited_devices__init(&msg);
	msg.version = kDevicesImageVersion;
	msg.n_mapped_paths = paths.size();
	msg.mapped_paths = paths.data();
	msg.n_files = file_ptrs.size();
	msg.files = file_ptrs.data();
	size_t len = cuda_inherited_devices__get_packed_size(&msg);
	std::vector<uint8_t> out(kHeader + len);
	std::memcpy(out.data(), kMagic, sizeof(kMagic));
	for (int i = 0; i < 4; i++)
		out[sizeof(kMagic) + i] = static_cast<uint8_t>(len >> (8 * i));
	cuda_inherited_devices__pack(&msg, out.data() + kHeader);
	return out;
}

Result<InheritedDevicesRecord> decode_devices_image(const uint8_t *data, size_t size)
{
	if (size < kHeader || std::memcmp(data, kMagic, sizeof(kMagic)) != 0)
		return make_error(EINVAL, "not a cuda_plugin devices image (bad magic or truncated header)");
	uint32_t len = 0;
	for (int i = 0; i < 4; i++)
		len |= static_cast<uint32_t>(data[sizeof(kMagic) + i]) << (8 * i);
	if (len != size - kHeader)
		return make_error(EINVAL, "truncated or padded devices image: header says %u bytes, file has %zu", len,
				  size - kHeader);
	std::unique_ptr<CudaInheritedDevices, void (*)(CudaInheritedDevices *)> msg(
		cuda_inherited_devices__unpack(nullptr, len, data + kHeader),
		[](CudaInheritedDevices *p) { cuda_inherited_devices__free_unpacked(p, nullptr); });
	if (!msg)
		return make_error(EINVAL, "corrupt devices image: its data does not parse");
	if (msg->version == 0 || msg->version > kDevicesImageVersion)
		return make_error(EPROTO, "devices image version %u: this plugin reads versions 1 to %u", msg->version,
				  kDevicesImageVersion);
	InheritedDevicesRecord r;
	for (size_t i = 0; i < msg->n_mapped_paths; i++)
		r.mapped_paths.emplace_back(msg->mapped_paths[i] ? msg->mapped_paths[i] : "");
	for (size_t i = 0; i < msg->n_files; i++) {
		const CudaInheritedFile *f = msg->files[i];
		r.files.push_back({f->id, f->has_flags ? f->flags : static_cast<uint32_t>(O_RDWR), f->path ? f->path : ""});
	}
	return r;
}

Status write_devices_image(int dir_fd, const InheritedDevicesRecord &record)
{
	std::vector<uint8_t> bytes = encode_devices_image(record);
	UniqueFd fd(openat(dir_fd, kDevicesImageFileName, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
			   0644));
	if (!fd.valid())
		return errno_error("create %s in the image directory", kDevicesImageFileName);
	size_t off = 0;
	while (off < bytes.size()) {
		ssize_t n = write(fd.get(), bytes.data() + off, bytes.size() - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return errno_error("write %s", kDevicesImageFileName);
		off += static_cast<size_t>(n);
	}
	return {};
}

Result<std::optional<InheritedDevicesRecord>> read_devices_image(int dir_fd)
{
	UniqueFd fd(openat(dir_fd, kDevicesImageFileName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
	if (!fd.valid()) {
		if (errno == ENOENT)
			return std::optional<InheritedDevicesRecord>();
		return errno_error("open %s", kDevicesImageFileName);
	}
	struct stat st;
	if (fstat(fd.get(), &st) != 0)
		return errno_error("stat %s", kDevicesImageFileName);
	if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) > kMaxBytes)
		return make_error(EINVAL, "%s is not a regular file of at most %zu bytes", kDevicesImageFileName,
				  kMaxBytes);
	std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
	size_t off = 0;
	while (off < data.size()) {
		ssize_t n = read(fd.get(), data.data() + off, data.size() - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno_error("read %s", kDevicesImageFileName);
		if (n == 0)
			break;
		off += static_cast<size_t>(n);
	}
	auto rec = decode_devices_image(data.data(), off);
	if (!rec)
		return std::move(rec).error().context("%s", kDevicesImageFileName);
	return std::optional<InheritedDevicesRecord>(std::move(*rec));
}

} // namespace cuda_criu
