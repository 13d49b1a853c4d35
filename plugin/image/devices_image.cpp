#include "image/devices_image.h"

#include <fcntl.h>

#include <cstring>
#include <memory>

#include "cuda_plugin.pb-c.h"
#include "image/image_file.h"

namespace cuda_criu {
namespace {

constexpr char kMagic[8] = {'C', 'U', 'D', 'A', 'D', 'E', 'V', 'S'};
constexpr RecordFile<InheritedDevicesRecord> kFile{kDevicesImageFileName, 4 << 20, encode_devices_image,
						   decode_devices_image};

// Points the message's array (n, array) at items' messages: each filled into the next slot of store
// (sized up front, so that the pointers stay valid) and listed in ptrs.
template <typename Msg, typename Item, typename Fill>
void add_messages(const std::vector<Item> &items, std::vector<Msg> &store, std::vector<Msg *> &ptrs, size_t &n,
		  Msg **&array, Fill fill)
{
	n = items.size();
	array = ptrs.data() + ptrs.size();
	for (const Item &item : items) {
		Msg &e = store[ptrs.size()];
		fill(e, item);
		ptrs.push_back(&e);
	}
}

} // namespace

Status write_devices_image(int dir_fd, const InheritedDevicesRecord &record) { return kFile.write(dir_fd, record); }

Result<std::optional<InheritedDevicesRecord>> read_devices_image(int dir_fd) { return kFile.read(dir_fd); }

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
		add_messages(p.mappings, maps, map_ptrs, m.n_mappings, m.mappings,
			     [](CudaInheritedMapping &e, const InheritedMappingRecord &v) {
				     cuda_inherited_mapping__init(&e);
				     e.start = v.start;
				     e.end = v.end;
				     e.has_offset = true;
				     e.offset = v.offset;
				     e.perms = const_cast<char *>(v.perms.c_str());
				     e.path = const_cast<char *>(v.path.c_str());
			     });
		add_messages(p.fds, fds, fd_ptrs, m.n_fds, m.fds, [](CudaInheritedFd &e, const InheritedFdRecord &f) {
			cuda_inherited_fd__init(&e);
			e.fd = f.fd;
			e.has_flags = true;
			e.flags = f.flags;
			e.path = const_cast<char *>(f.path.c_str());
		});
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
	return pack_framed(kMagic, msg, cuda_inherited_devices__get_packed_size, cuda_inherited_devices__pack);
}

Result<InheritedDevicesRecord> decode_devices_image(const uint8_t *data, size_t size)
{
	auto unpacked = unpack_framed(data, size, kMagic, "devices image", cuda_inherited_devices__unpack,
				      cuda_inherited_devices__free_unpacked);
	if (!unpacked)
		return std::move(unpacked).error();
	const Unpacked<CudaInheritedDevices> &msg = *unpacked;
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

} // namespace cuda_criu
