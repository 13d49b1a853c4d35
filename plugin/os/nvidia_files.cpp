#include "os/nvidia_files.h"

#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/text.h"
#include "os/dir.h"
#include "os/proc.h"
#include "os/unique_fd.h"

namespace cuda_criu {
namespace {

constexpr unsigned kNvidiaMajor = 195;
constexpr unsigned kNvidiaCtlMinor = 255;

std::vector<unsigned> read_nvidia_majors()
{
	std::vector<unsigned> majors;
	auto text = read_small_file("/proc/devices");
	if (!text)
		return majors;
	std::istringstream f(*text);
	std::string line;
	bool chars = false;
	while (std::getline(f, line)) {
		if (line.rfind("Character devices:", 0) == 0) {
			chars = true;
			continue;
		}
		if (line.rfind("Block devices:", 0) == 0)
			break;
		if (!chars)
			continue;
		std::istringstream in(line);
		unsigned major = 0;
		std::string name;
		if (in >> major >> name && name.rfind("nvidia", 0) == 0)
			majors.push_back(major);
	}
	return majors;
}

// The test seam of is_nvidia_device_file: "$FAKEGPU_DIR/dev/", or empty when the variable is unset.
std::string fake_device_dir()
{
	const char *dir = std::getenv("FAKEGPU_DIR");
	if (!dir || dir[0] != '/')
		return {};
	std::string d(dir);
	while (d.size() > 1 && d.back() == '/')
		d.pop_back();
	return d + "/dev/";
}

} // namespace

const std::vector<unsigned> &nvidia_char_majors()
{
	static const std::vector<unsigned> majors = read_nvidia_majors();
	return majors;
}

std::string fd_path(int fd)
{
	char link[64], target[4096];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return {};
	return std::string(target, static_cast<size_t>(n));
}

bool is_nvidia_gpu_node(const struct stat &st)
{
	return S_ISCHR(st.st_mode) && major(st.st_rdev) == kNvidiaMajor && minor(st.st_rdev) < kNvidiaCtlMinor;
}

bool is_nvidia_device_file(int fd, const struct stat &st)
{
	if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode))
		return false;
	if (S_ISCHR(st.st_mode))
		for (unsigned m : nvidia_char_majors())
			if (major(st.st_rdev) == m)
				return true;
	std::string fake = fake_device_dir();
	if (fake.empty())
		return false;
	std::string path = fd_path(fd);
	return path.size() > fake.size() && path.compare(0, fake.size(), fake) == 0 &&
	       path.find('/', fake.size()) == std::string::npos;
}

std::vector<unsigned long> nvidia_device_mappings(pid_t pid)
{
	std::vector<unsigned long> starts;
	std::string dir = "/proc/" + std::to_string(pid) + "/map_files";
	auto d = Dir::open(dir);
	if (!d)
		return starts;
	while (const char *name = d->next()) {
		// O_PATH: no driver open() call; the stat and the link are all that is needed.
		UniqueFd fd(openat(d->fd(), name, O_PATH | O_CLOEXEC));
		struct stat st;
		if (!fd.valid() || fstat(fd.get(), &st) != 0)
			continue;
		if (is_nvidia_device_file(fd.get(), st))
			starts.push_back(std::strtoul(name, nullptr, 16));
	}
	return starts;
}

std::vector<DeviceMapping> nvidia_device_mapping_list(pid_t pid)
{
	std::vector<DeviceMapping> out;
	std::string dir = "/proc/" + std::to_string(pid);
	std::string map_files = dir + "/map_files/";
	// A large process (PyTorch) has thousands of mappings: more than the default 1 MiB of text.
	for_each_line(
		dir + "/maps",
		[&](std::istringstream &f) {
			// "START-END PERMS OFFSET DEV INODE PATH"; only file mappings can be of a device.
			std::string range, perms, offset, dev, inode;
			if (!(f >> range >> perms >> offset >> dev >> inode) || inode == "0")
				return;
			// O_PATH: no driver open() call; the stat and the link are all that is needed.
			UniqueFd fd(open((map_files + range).c_str(), O_PATH | O_CLOEXEC));
			struct stat st;
			if (!fd.valid() || fstat(fd.get(), &st) != 0 || !is_nvidia_device_file(fd.get(), st))
				return;
			DeviceMapping m;
			m.start = std::strtoul(range.c_str(), nullptr, 16);
			m.end = std::strtoul(range.c_str() + range.find('-') + 1, nullptr, 16);
			m.offset = std::strtoul(offset.c_str(), nullptr, 16);
			m.perms = perms;
			m.path = fd_path(fd.get());
			out.push_back(std::move(m));
		},
		64 << 20);
	return out;
}

std::vector<DeviceFd> nvidia_device_fds(pid_t pid)
{
	std::vector<DeviceFd> out;
	std::string dir = "/proc/" + std::to_string(pid);
	auto d = Dir::open(dir + "/fd");
	if (!d)
		return out;
	while (const char *name = d->next()) {
		UniqueFd fd(openat(d->fd(), name, O_PATH | O_CLOEXEC));
		struct stat st;
		if (!fd.valid() || fstat(fd.get(), &st) != 0 || !is_nvidia_device_file(fd.get(), st))
			continue;
		DeviceFd e;
		e.fd = std::atoi(name);
		e.path = fd_path(fd.get());
		if (auto info = read_small_file(dir + "/fdinfo/" + name)) {
			size_t at = info->find("flags:");
			if (at != std::string::npos)
				e.flags = static_cast<unsigned>(std::strtoul(info->c_str() + at + 6, nullptr, 8));
		}
		out.push_back(std::move(e));
	}
	std::sort(out.begin(), out.end(), [](const DeviceFd &a, const DeviceFd &b) { return a.fd < b.fd; });
	return out;
}

} // namespace cuda_criu
