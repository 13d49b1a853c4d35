#include "os/mem_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <utility>

namespace cuda_criu {

Result<MemFile> MemFile::create(const std::string &name, uint64_t bytes)
{
	MemFile f;
	f.fd_.reset(memfd_create(name.c_str(), MFD_CLOEXEC));
	if (!f.fd_.valid())
		return make_error(errno, "cannot create a memory file for %s: %s", name.c_str(), std::strerror(errno));
	struct stat st{};
	if (ftruncate(f.fd(), static_cast<off_t>(bytes)) != 0 || fstat(f.fd(), &st) != 0)
		return make_error(errno, "cannot size the memory file %s to %" PRIu64 " bytes: %s", name.c_str(), bytes,
				  std::strerror(errno));
	f.bytes_ = bytes;
	f.inode_ = st.st_ino;
	return f;
}

MemFile::MemFile(MemFile &&other) noexcept
	: fd_(std::move(other.fd_)), bytes_(std::exchange(other.bytes_, 0)), inode_(std::exchange(other.inode_, 0)),
	  data_(std::exchange(other.data_, nullptr))
{
}

MemFile &MemFile::operator=(MemFile &&other) noexcept
{
	if (this != &other) {
		unmap();
		fd_ = std::move(other.fd_);
		bytes_ = std::exchange(other.bytes_, 0);
		inode_ = std::exchange(other.inode_, 0);
		data_ = std::exchange(other.data_, nullptr);
	}
	return *this;
}

Status MemFile::map()
{
	if (data_ || !bytes_)
		return {};
	void *p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd(), 0);
	if (p == MAP_FAILED)
		return make_error(errno, "cannot map a memory file of %" PRIu64 " bytes: %s", bytes_, std::strerror(errno));
	data_ = static_cast<uint8_t *>(p);
	return {};
}

void MemFile::unmap()
{
	if (data_)
		munmap(data_, bytes_);
	data_ = nullptr;
}

void MemFile::free_memory()
{
	unmap();
	if (fd_.valid())
		(void)ftruncate(fd(), 0);
}

} // namespace cuda_criu
