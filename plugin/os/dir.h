// Move-only owner of an open directory stream (close-on-exec), for reading a directory's entries.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "base/result.h"

namespace cuda_criu {

class Dir {
public:
	// The directory at path (relative paths against dir_fd: AT_FDCWD for the working directory), on a
	// file description of its own: reading it moves no offset of dir_fd's.
	static Result<Dir> open(const std::string &path, int dir_fd = AT_FDCWD);

	// The next entry's name, "." and ".." left out; nullptr at the end.
	const char *next();
	// The stream's own fd, for the *at() calls on the entries (owned by the stream).
	int fd() const { return dirfd(dir_.get()); }

private:
	explicit Dir(DIR *dir) : dir_(dir, closedir) {}
	std::unique_ptr<DIR, int (*)(DIR *)> dir_;
};

// The entry names of the directory at path, "." and ".." left out, in the directory's order; empty when
// it cannot be read.
std::vector<std::string> dir_entries(const std::string &path);

// The pids /proc lists now, in its order.
std::vector<pid_t> proc_pids();

} // namespace cuda_criu
