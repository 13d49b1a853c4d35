#include "os/mem_file.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <utility>

#include "base/format.h"

namespace cuda_criu {

namespace {

// A file on a tmpfs of the plugin's own with huge=always, mounted nowhere (fsopen/fsmount: the mount
// lives as long as the file is open), unlinked at once: -1 where that cannot be had (no CAP_SYS_ADMIN,
// a kernel before 5.2, shmem_enabled=deny). Its memory comes in 2 MiB pages even where the host's
// shmem_enabled is `never` (memfd's setting): a fault, a page table entry and a free each per 2 MiB
// instead of per 4 KiB, for the decoders that fill it, the driver that reads it through CRIU's mapping,
// and the truncation that gives it back.
int open_huge_tmpfs_file(const std::string &name)
{
	UniqueFd fs(static_cast<int>(syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC)));
	if (!fs.valid())
		return -1;
	// size=0: no limit of its own (the memory's own limits stay: the cgroup's, the machine's).
	if (syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_STRING, "huge", "always", 0) != 0 ||
	    syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_STRING, "size", "0", 0) != 0 ||
	    syscall(SYS_fsconfig, fs.get(), FSCONFIG_SET_STRING, "mode", "0700", 0) != 0 ||
	    syscall(SYS_fsconfig, fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0)
		return -1;
	UniqueFd mnt(static_cast<int>(syscall(SYS_fsmount, fs.get(), FSMOUNT_CLOEXEC, 0)));
	if (!mnt.valid())
		return -1;
	int fd = openat(mnt.get(), name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0)
		(void)unlinkat(mnt.get(), name.c_str(), 0);
	return fd;
}

} // namespace

Result<MemFile> MemFile::create(const std::string &name, uint64_t bytes)
{
	MemFile f;
	f.fd_.reset(open_huge_tmpfs_file(name));
	f.huge_ = f.fd_.valid();
	if (!f.huge_)
		f.fd_.reset(memfd_create(name.c_str(), MFD_CLOEXEC));
	if (!f.fd_.valid())
		return make_error(errno, "cannot create a memory file for %s: %s", name.c_str(), std::strerror(errno));
	struct stat st{};
	if (ftruncate(f.fd(), static_cast<off_t>(bytes)) != 0 || fstat(f.fd(), &st) != 0)
		return make_error(errno, "cannot size the memory file %s to %" PRIu64 " bytes: %s", name.c_str(), bytes,
				  std::strerror(errno));
	f.bytes_ = bytes;
	f.inode_ = st.st_ino;
	f.dev_ = st.st_dev;
	return f;
}

Result<MemFile> MemFile::adopt(UniqueFd fd, uint64_t bytes, bool huge)
{
	struct stat st {};
	if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes)
		return make_error(EINVAL, "not a memory file of %" PRIu64 " bytes", bytes);
	MemFile f;
	f.fd_ = std::move(fd);
	f.bytes_ = bytes;
	f.inode_ = st.st_ino;
	f.dev_ = st.st_dev;
	f.huge_ = huge;
	return f;
}

bool MemFile::is(const Mapping &m) const
{
	return m.inode == inode_ && m.dev == format("%02x:%02x", major(dev_), minor(dev_));
}

MemFile::MemFile(MemFile &&other) noexcept
	: fd_(std::move(other.fd_)), bytes_(std::exchange(other.bytes_, 0)), inode_(std::exchange(other.inode_, 0)),
	  dev_(std::exchange(other.dev_, 0)), huge_(std::exchange(other.huge_, false)),
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
		dev_ = std::exchange(other.dev_, 0);
		huge_ = std::exchange(other.huge_, false);
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
