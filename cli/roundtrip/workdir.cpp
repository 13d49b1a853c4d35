#include "roundtrip/workdir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "base/format.h"

namespace cuda_criu::cli::roundtrip {

Status WorkDir::check_existing(const std::string &dir)
{
	struct stat st = {};
	if (lstat(dir.c_str(), &st) != 0)
		return make_error(errno, "--dir %s: %s", dir.c_str(), errno_string(errno).c_str());
	if (S_ISLNK(st.st_mode))
		return make_error(ELOOP, "--dir %s is a symbolic link: give the directory itself", dir.c_str());
	if (!S_ISDIR(st.st_mode))
		return make_error(ENOTDIR, "--dir %s is not a directory", dir.c_str());
	if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
		return make_error(EPERM,
				  "--dir %s is %s: another user could put links or other images in it between the dump "
				  "and the restore; give a directory of your own that only you can write (mkdir -m 700), "
				  "or leave --dir out",
				  dir.c_str(),
				  st.st_uid != geteuid() ? format("owned by uid %u, not by you", st.st_uid).c_str()
							 : format("writable by others (mode %04o)", st.st_mode & 07777).c_str());
	std::error_code ec;
	if (!std::filesystem::is_empty(dir, ec))
		return make_error(EEXIST, "--dir %s is not empty (the round trip needs a fresh directory)", dir.c_str());
	return {};
}

Result<WorkDir> WorkDir::make_temp(const std::string &parent, const std::string &prefix)
{
	std::string base = parent + "/" + prefix + ".XXXXXX";
	std::vector<char> tmpl(base.begin(), base.end());
	tmpl.push_back('\0');
	if (!mkdtemp(tmpl.data()))
		return make_error(errno, "cannot create a work directory %s: %s", base.c_str(), errno_string(errno).c_str());
	WorkDir w;
	w.path_ = tmpl.data();
	w.created_ = true;
	w.make_absolute();
	return w;
}

Result<WorkDir> WorkDir::create(const std::string &dir)
{
	if (dir.empty()) {
		const char *tmp = std::getenv("TMPDIR");
		return make_temp(tmp && *tmp ? tmp : "/tmp", "cuda-criu-roundtrip");
	}
	WorkDir w;
	if (mkdir(dir.c_str(), 0700) == 0) {
		w.created_ = true;
	} else if (errno != EEXIST) {
		return make_error(errno, "mkdir %s: %s", dir.c_str(), errno_string(errno).c_str());
	} else if (auto ok = check_existing(dir); !ok) {
		return std::move(ok).error();
	}
	w.path_ = dir;
	w.make_absolute();
	return w;
}

// Absolute: CRIU, the health command and the messages all get the same path.
void WorkDir::make_absolute()
{
	std::error_code ec;
	if (auto abs = std::filesystem::absolute(path_, ec); !ec)
		path_ = abs.lexically_normal().string();
	if (!path_.empty() && path_.back() == '/')
		path_.pop_back();
}

Result<UniqueFd> WorkDir::create_file(const std::string &name, int flags) const
{
	std::string path = file(name);
	if (unlink(path.c_str()) != 0 && errno != ENOENT)
		return errno_error("remove %s", path.c_str());
	UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | flags, 0644));
	if (!fd.valid())
		return make_error(errno, "create %s: %s", path.c_str(), errno_string(errno).c_str());
	return fd;
}

Status WorkDir::make_dir(const std::string &name) const
{
	std::string path = file(name);
	if (mkdir(path.c_str(), 0700) != 0)
		return make_error(errno, "mkdir %s: %s", path.c_str(), errno_string(errno).c_str());
	return {};
}

void WorkDir::clear() const
{
	if (path_.empty())
		return;
	std::error_code ec;
	if (created_) {
		std::filesystem::remove_all(path_, ec);
		return;
	}
	for (const auto &entry : std::filesystem::directory_iterator(path_, ec))
		std::filesystem::remove_all(entry.path(), ec);
}

uint64_t tree_bytes(const std::string &dir)
{
	uint64_t total = 0;
	std::error_code ec;
	for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
	     !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
		if (it->is_regular_file(ec))
			if (uintmax_t n = it->file_size(ec); !ec)
				total += n;
	return total;
}

} // namespace cuda_criu::cli::roundtrip
