#include "image/devices_image.h"

#include <fcntl.h>

#include <cstring>
#include <memory>

#include "cuda_plugin.pb-c.h"
#include "image/image_file.h"

namespace cuda_criu {
namespace {

constexpr char kMagic[8] = {'C', 'U', 'D', 'A', 'D', 'E', 'V', 'S'};
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
	std::vector<uint8_t> out = framed_buffer(kMagic, len);
	cuda_inherited_devices__pack(&msg, out.data() + kImageHeaderBytes);
	return out;
}

Result<InheritedDevicesRecord> decode_devices_image(const uint8_t *data, size_t size)
{
	auto len = unframe(data, size, kMagic, "devices image");
	if (!len)
		return std::move(len).error();
	std::unique_ptr<CudaInheritedDevices, void (*)(CudaInheritedDevices *)> msg(
		cuda_inherited_devices__unpack(nullptr, *len, data + kImageHeaderBytes),
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
	return write_image_file(dir_fd, kDevicesImageFileName, encode_devices_image(record));
}

Result<std::optional<InheritedDevicesRecord>> read_devices_image(int dir_fd)
{
	auto data = read_image_file(dir_fd, kDevicesImageFileName, kMaxBytes);
	if (!data)
		return std::move(data).error();
	if (!*data)
		return std::optional<InheritedDevicesRecord>();
	auto rec = decode_devices_image((*data)->data(), (*data)->size());
	if (!rec)
		return std::move(rec).error().context("%s", kDevicesImageFileName);
	return std::optional<InheritedDevicesRecord>(std::move(*rec));
}

} // namespace cuda_criu
