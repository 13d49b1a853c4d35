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
	// Per process; the vectors are sized up front so that the pointers into them stay valid.
	size_t nmaps = 0, nfds = 0;
	for (const auto &p : record.processes) {
		nmaps += p.mappings.size();
		nfds += p.fds.size();
	}
	std::vector<CudaInheritedMapping> maps(nmaps);
	std::vector<CudaInheritedMapping *> map_ptrs;
	std::vector<CudaInheritedFd> fds(nfds);
	std::vector<CudaInheritedFd *> fd_ptrs;
	std::vector<CudaInheritedProcess> procs(record.processes.size());
	std::vector<CudaInheritedProcess *> proc_ptrs;
	map_ptrs.reserve(nmaps);
	fd_ptrs.reserve(nfds);
	for (size_t i = 0; i < record.processes.size(); i++) {
		const InheritedProcessRecord &p = record.processes[i];
		CudaInheritedProcess &m = procs[i];
		cuda_inherited_process__init(&m);
		m.pid = p.pid;
		m.has_ns_pid = p.ns_pid != 0;
		m.ns_pid = p.ns_pid;
		m.n_mappings = p.mappings.size();
		m.mappings = map_ptrs.data() + map_ptrs.size();
		for (const auto &v : p.mappings) {
			CudaInheritedMapping &e = maps[map_ptrs.size()];
			cuda_inherited_mapping__init(&e);
			e.start = v.start;
			e.end = v.end;
			e.has_offset = true;
			e.offset = v.offset;
			e.perms = const_cast<char *>(v.perms.c_str());
			e.path = const_cast<char *>(v.path.c_str());
			map_ptrs.push_back(&e);
		}
		m.n_fds = p.fds.size();
		m.fds = fd_ptrs.data() + fd_ptrs.size();
		for (const auto &f : p.fds) {
			CudaInheritedFd &e = fds[fd_ptrs.size()];
			cuda_inherited_fd__init(&e);
			e.fd = f.fd;
			e.has_flags = true;
			e.flags = f.flags;
			e.path = const_cast<char *>(f.path.c_str());
			fd_ptrs.push_back(&e);
		}
		proc_ptrs.push_back(&m);
	}
	CudaInheritedDevices msg;
	cuda_inherited_devices__init(&msg);
	msg.n_processes = proc_ptrs.size();
	msg.processes = proc_ptrs.data();
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
	for (size_t i = 0; i < msg->n_processes; i++) {
		const CudaInheritedProcess *p = msg->processes[i];
		InheritedProcessRecord pr;
		pr.pid = p->pid;
		pr.ns_pid = p->has_ns_pid ? p->ns_pid : 0;
		for (size_t k = 0; k < p->n_mappings; k++) {
			const CudaInheritedMapping *m = p->mappings[k];
			pr.mappings.push_back({m->start, m->end, m->has_offset ? m->offset : 0, m->perms ? m->perms : "",
					       m->path ? m->path : ""});
		}
		for (size_t k = 0; k < p->n_fds; k++) {
			const CudaInheritedFd *f = p->fds[k];
			pr.fds.push_back({f->fd, f->has_flags ? f->flags : 0, f->path ? f->path : ""});
		}
		r.processes.push_back(std::move(pr));
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
