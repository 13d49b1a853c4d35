#include "core/inherited_devices.h"

#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "base/log.h"

namespace cuda_criu {

Result<bool> InheritedDevicesDump::claim_mapping(int fd, const struct stat &st)
{
	if (!host_.is_nvidia_device_file(fd, st))
		return false;
	if (auto s = describe_processes(); !s)
		return std::move(s).error();
	std::string path = host_.fd_path(fd);
	if (path.empty())
		return make_error(EIO, "a mapped NVIDIA device file (rdev %u:%u) has no path: cannot record it",
				  major(st.st_rdev), minor(st.st_rdev));
	auto &paths = record_.mapped_paths;
	if (std::find(paths.begin(), paths.end(), path) == paths.end()) {
		paths.push_back(path);
		if (auto s = save(); !s)
			return std::move(s).error();
	}
	LOG_INFO("mapping of %s inherited from the NVIDIA driver: restored as zero-filled memory", path.c_str());
	return true;
}

Result<bool> InheritedDevicesDump::claim_file(int lfd, uint32_t id)
{
	struct stat st;
	if (fstat(lfd, &st) != 0)
		return errno_error("stat file id %#x", id);
	if (!host_.is_nvidia_device_file(lfd, st))
		return false;
	int fl = fcntl(lfd, F_GETFL);
	if (fl < 0)
		return errno_error("read the flags of file id %#x", id);
	if (auto st = describe_processes(); !st)
		return std::move(st).error();
	std::string path = host_.fd_path(lfd);
	record_.files.push_back({id, static_cast<uint32_t>(fl & (O_ACCMODE | O_NONBLOCK | O_APPEND)), path});
	if (auto s = save(); !s)
		return std::move(s).error();
	LOG_INFO("file %s (id %#x) inherited from the NVIDIA driver: restored as /dev/null", path.c_str(), id);
	return true;
}

Status InheritedDevicesDump::describe_processes()
{
	if (refusal_)
		return *refusal_;
	if (described_)
		return {};
	described_ = true;
	for (pid_t pid : host_.traced_processes()) {
		HeldDeviceFiles held = host_.nvidia_device_files(pid);
		if (held.mappings.empty() && held.fds.empty())
			continue;
		if (Status st = allowed_(pid); !st) {
			refusal_ = std::move(st).error().context("%s", "the dump is refused (the tree goes on running)");
			return *refusal_;
		}
		InheritedProcessRecord p;
		p.pid = pid;
		p.ns_pid = held.ns_pid;
		for (const DeviceMapping &m : held.mappings)
			p.mappings.push_back({m.start, m.end, m.offset, m.perms, m.path});
		for (const DeviceFd &f : held.fds)
			p.fds.push_back({f.fd, f.flags, f.path});
		if (!p.mappings.empty() || !p.fds.empty())
			record_.processes.push_back(std::move(p));
	}
	LOG_INFO("%zu process(es) of the tree hold NVIDIA device files inherited from a CUDA parent",
		 record_.processes.size());
	return {};
}

Status InheritedDevicesDump::save()
{
	if (auto s = write_devices_image(dir_fd_, record_); !s)
		return std::move(s).error().context("%s", "cannot record the NVIDIA device files of forked processes");
	return {};
}

Status check_no_device_mappings(Host &host, pid_t pid)
{
	auto maps = host.nvidia_device_mappings(pid);
	if (maps.empty())
		return {};
	return make_error(EBUSY,
			  "pid %d still maps %zu NVIDIA device file(s) (first at %#lx) after its CUDA checkpoint: the "
			  "driver should have released them; the process cannot be dumped consistently (report this "
			  "with the driver version)",
			  pid, maps.size(), maps.front());
}

Status InheritedDevicesRestore::load()
{
	if (loaded_)
		return {};
	auto rec = read_devices_image(dir_fd_);
	if (!rec)
		return std::move(rec).error().context("%s", "cannot restore the NVIDIA device files of forked processes");
	if (*rec)
		record_ = std::move(**rec);
	loaded_ = true;
	return {};
}

namespace {

std::string base_name(const std::string &path) { return path.substr(path.rfind('/') + 1); }

} // namespace

Result<std::optional<int>> InheritedDevicesRestore::mapping_fd(const char *path)
{
	if (auto s = load(); !s)
		return std::move(s).error();
	// By file name: CRIU records the path as the task saw it ("/dev/nvidia0" inside a container), the
	// plugin as CRIU saw it (the same node can read "/nvidia0" from outside the container's mounts).
	// Only mappings some plugin claimed at dump reach this hook, and no other plugin claims these names.
	const auto &paths = record_.mapped_paths;
	bool ours = path && std::any_of(paths.begin(), paths.end(), [&](const std::string &p) {
		return p == path || base_name(p) == base_name(path);
	});
	if (!ours)
		return std::optional<int>();
	// MAP_SHARED of /dev/zero is fresh shared anonymous memory of the vma's own size: the offset is
	// irrelevant and nothing is shared with another mapping. O_RDWR allows a writable shared mapping.
	int fd = open("/dev/zero", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return errno_error("open /dev/zero as the placeholder of a mapping of %s", path);
	return std::optional<int>(fd);
}

Result<std::optional<int>> InheritedDevicesRestore::file_fd(uint32_t id)
{
	if (auto s = load(); !s)
		return std::move(s).error();
	for (const auto &f : record_.files) {
		if (f.id != id)
			continue;
		int fd = open("/dev/null", static_cast<int>(f.flags & (O_ACCMODE | O_NONBLOCK | O_APPEND)));
		if (fd < 0)
			return errno_error("open /dev/null as the placeholder of %s (file id %#x)", f.path.c_str(), id);
		return std::optional<int>(fd);
	}
	return std::optional<int>();
}

} // namespace cuda_criu
