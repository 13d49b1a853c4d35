// The round trip's work directory: images, CRIU's output and logs, the program's output. It is private
// to this user (its own, mode 0700, or an existing one nobody else can write to), and files in it are
// created new (never through a link, never an existing file), so that no other user can plant a link or
// swap an image between the dump and the restore.
#pragma once

#include <cstdint>
#include <string>

#include "base/result.h"
#include "os/unique_fd.h"

namespace cuda_criu::cli::roundtrip {

class WorkDir {
public:
	// dir empty: a new directory in $TMPDIR (else /tmp). Otherwise dir is made (mode 0700), or, when it
	// exists, must be an empty directory (not a link) owned by this user that no group or other can write.
	static Result<WorkDir> create(const std::string &dir);
	// A new directory PARENT/PREFIX.XXXXXX (mkdtemp: mode 0700).
	static Result<WorkDir> make_temp(const std::string &parent, const std::string &prefix);

	WorkDir() = default;
	const std::string &path() const { return path_; }
	std::string file(const std::string &name) const { return path_ + "/" + name; }
	// Creates name afresh (an older file of that name is removed first), close-on-exec; flags: O_APPEND or 0.
	Result<UniqueFd> create_file(const std::string &name, int flags = 0) const;
	Status make_dir(const std::string &name) const;
	// Removes what the round trip put there, and the directory itself when it made it.
	void clear() const;

private:
	static Status check_existing(const std::string &dir);
	void make_absolute();
	std::string path_;
	bool created_ = false;
};

// The bytes of the regular files under dir.
uint64_t tree_bytes(const std::string &dir);

} // namespace cuda_criu::cli::roundtrip
