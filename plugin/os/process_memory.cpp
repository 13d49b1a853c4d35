#include "os/process_memory.h"

#include <fcntl.h>
#include <sys/uio.h>

#include <cinttypes>

#include "os/unique_fd.h"

namespace cuda_criu {
namespace {

// One process_vm_* call moves at most this much (the kernel's own limit is per iovec and per call).
constexpr size_t kStep = 64 << 20;

Status write_through_proc_mem(pid_t pid, uint64_t addr, const uint8_t *p, size_t len)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/mem", pid);
	UniqueFd fd(open(path, O_WRONLY | O_CLOEXEC));
	if (!fd.valid())
		return errno_error("open %s", path);
	while (len) {
		ssize_t n = pwrite(fd.get(), p, len, static_cast<off_t>(addr));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return errno_error("write %zu bytes at %#" PRIx64 " of pid %d", len, addr, pid);
		p += n;
		addr += static_cast<uint64_t>(n);
		len -= static_cast<size_t>(n);
	}
	return {};
}

} // namespace

Status read_process_memory(pid_t pid, uint64_t addr, void *buf, size_t len)
{
	auto *p = static_cast<uint8_t *>(buf);
	while (len) {
		size_t step = len < kStep ? len : kStep;
		iovec local{p, step};
		iovec remote{reinterpret_cast<void *>(addr), step}; // NOLINT(performance-no-int-to-ptr): another process's address
		ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno_error("read %zu bytes at %#" PRIx64 " of pid %d", step, addr, pid);
		if (n == 0)
			return make_error(EFAULT, "read at %#" PRIx64 " of pid %d: nothing mapped there", addr, pid);
		p += n;
		addr += static_cast<uint64_t>(n);
		len -= static_cast<size_t>(n);
	}
	return {};
}

Status write_process_memory(pid_t pid, uint64_t addr, const void *buf, size_t len)
{
	const auto *p = static_cast<const uint8_t *>(buf);
	while (len) {
		size_t step = len < kStep ? len : kStep;
		iovec local{const_cast<uint8_t *>(p), step};
		iovec remote{reinterpret_cast<void *>(addr), step}; // NOLINT(performance-no-int-to-ptr): another process's address
		ssize_t n = process_vm_writev(pid, &local, 1, &remote, 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EFAULT) // not writable there (process_vm_writev does not force)
			return write_through_proc_mem(pid, addr, p, len);
		if (n < 0)
			return errno_error("write %zu bytes at %#" PRIx64 " of pid %d", step, addr, pid);
		if (n == 0)
			return make_error(EFAULT, "write at %#" PRIx64 " of pid %d: nothing mapped there", addr, pid);
		p += n;
		addr += static_cast<uint64_t>(n);
		len -= static_cast<size_t>(n);
	}
	return {};
}

} // namespace cuda_criu
