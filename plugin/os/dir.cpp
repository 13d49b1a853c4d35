#include "os/dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace cuda_criu {

Result<Dir> Dir::open(const std::string &path, int dir_fd)
{
	int fd = openat(dir_fd, path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return errno_error("open the directory %s", path.c_str());
	DIR *d = fdopendir(fd);
	if (!d) {
		Error e = errno_error("read the directory %s", path.c_str());
		close(fd);
		return e;
	}
	return Dir(d);
}

const char *Dir::next()
{
	while (const dirent *e = readdir(dir_.get()))
		if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
			return e->d_name;
	return nullptr;
}

std::vector<std::string> dir_entries(const std::string &path)
{
	std::vector<std::string> out;
	if (auto d = Dir::open(path))
		while (const char *name = d->next())
			out.emplace_back(name);
	return out;
}

std::vector<pid_t> proc_pids()
{
	std::vector<pid_t> out;
	for (const std::string &name : dir_entries("/proc")) {
		char *end = nullptr;
		long pid = std::strtol(name.c_str(), &end, 10);
		if (pid > 0 && *end == '\0')
			out.push_back(static_cast<pid_t>(pid));
	}
	return out;
}

} // namespace cuda_criu
