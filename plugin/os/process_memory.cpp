#include "os/process_memory.h"

#include <fcntl.h>
#include <sys/uio.h>

#include <algorithm>
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

// process_vm_readv or process_vm_writev over [addr, addr + len) of pid, in steps. *done: the bytes moved
// before a failure.
using VmCall = ssize_t (*)(pid_t, const iovec *, unsigned long, const iovec *, unsigned long, unsigned long);

// p: the local buffer (written by process_vm_readv; iovec has no const).
Status transfer(VmCall call, const char *verb, pid_t pid, uint64_t addr, const uint8_t *p, size_t len, size_t *done)
{
	*done = 0;
	while (*done < len) {
		size_t step = std::min(len - *done, kStep);
		iovec local{const_cast<uint8_t *>(p + *done), step};
		iovec remote{reinterpret_cast<void *>(addr + *done), step}; // NOLINT(performance-no-int-to-ptr): another process's address
		ssize_t n = call(pid, &local, 1, &remote, 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno_error("%s %zu bytes at %#" PRIx64 " of pid %d", verb, step, addr + *done, pid);
		if (n == 0)
			return make_error(EFAULT, "%s at %#" PRIx64 " of pid %d: nothing mapped there", verb, addr + *done, pid);
		*done += static_cast<size_t>(n);
	}
	return {};
}

} // namespace

Status read_process_memory(pid_t pid, uint64_t addr, void *buf, size_t len)
{
	size_t done = 0;
	return transfer(process_vm_readv, "read", pid, addr, static_cast<uint8_t *>(buf), len, &done);
}

Status write_process_memory(pid_t pid, uint64_t addr, const void *buf, size_t len)
{
	const auto *p = static_cast<const uint8_t *>(buf);
	size_t done = 0;
	Status st = transfer(process_vm_writev, "write", pid, addr, p, len, &done);
	if (!st && st.error().errno_value() == EFAULT) // not writable there (process_vm_writev does not force)
		return write_through_proc_mem(pid, addr + done, p + done, len - done);
	return st;
}

} // namespace cuda_criu
