// A private directory under /tmp for a test's files, removed with everything in it at the end.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace cuda_criu::testing {

class TempDir {
public:
	TempDir()
	{
		char tmpl[] = "/tmp/cuda_criu_unit.XXXXXX";
		path_ = mkdtemp(tmpl);
		fd_ = open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	}
	~TempDir()
	{
		close(fd_);
		std::string cmd = "rm -rf '" + path_ + "'";
		(void)std::system(cmd.c_str());
	}
	TempDir(const TempDir &) = delete;
	TempDir &operator=(const TempDir &) = delete;

	const std::string &path() const { return path_; }
	int fd() const { return fd_; }
	std::string file(const std::string &name) const { return path_ + "/" + name; }
	bool exists(const std::string &name) const { return access(file(name).c_str(), F_OK) == 0; }
	void write(const std::string &name, const std::vector<uint8_t> &data) const
	{
		int fd = open(file(name).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		ASSERT_GE(fd, 0);
		ASSERT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
		close(fd);
	}
	void resize(const std::string &name, off_t size) const { ASSERT_EQ(truncate(file(name).c_str(), size), 0); }

private:
	std::string path_;
	int fd_ = -1;
};

} // namespace cuda_criu::testing
