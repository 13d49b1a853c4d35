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
