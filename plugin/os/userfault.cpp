#include "os/userfault.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>

namespace cuda_criu {

Result<std::vector<uint64_t>> Userfault::read_faults()
{
	std::vector<uint64_t> faults;
	uffd_msg msgs[64];
	for (;;) {
		ssize_t n = ::read(fd_.get(), msgs, sizeof(msgs));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return faults;
		if (n < 0)
			return errno_error("%s", "read the userfaultfd");
		for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(uffd_msg); i++)
			if (msgs[i].event == UFFD_EVENT_PAGEFAULT)
				faults.push_back(msgs[i].arg.pagefault.address);
		if (static_cast<size_t>(n) < sizeof(msgs))
			return faults;
	}
}

Status Userfault::map_from_file(uint64_t addr, uint64_t len)
{
	const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
	const uint64_t start = addr, end = addr + len;
	bool skipped = false;
	while (addr < end) {
		uffdio_continue c{};
		c.range = {addr, end - addr};
		if (ioctl(fd_.get(), UFFDIO_CONTINUE, &c) == 0)
			break;
		if (errno == EAGAIN) { // the process's mappings changed meanwhile: on from what was mapped
			addr += c.mapped > 0 ? static_cast<uint64_t>(c.mapped) : 0;
		} else if (errno == EEXIST) { // the range's first page is mapped already: on past it
			addr += page;
			skipped = true;
		} else
			return errno_error("UFFDIO_CONTINUE %#" PRIx64 "-%#" PRIx64, addr, end);
	}
	// A skipped page's waiter (if any) is woken too; those of the pages mapped here were woken by the kernel.
	return skipped ? wake(start, len) : Status();
}

Status Userfault::wake(uint64_t addr, uint64_t len)
{
	uffdio_range r{addr, len};
	if (ioctl(fd_.get(), UFFDIO_WAKE, &r) != 0)
		return errno_error("UFFDIO_WAKE %#" PRIx64 "-%#" PRIx64, addr, addr + len);
	return {};
}

Status Userfault::unregister(uint64_t addr, uint64_t len)
{
	uffdio_range r{addr, len};
	if (ioctl(fd_.get(), UFFDIO_UNREGISTER, &r) != 0)
		return errno_error("UFFDIO_UNREGISTER %#" PRIx64 "-%#" PRIx64, addr, addr + len);
	return {};
}

Result<UniqueFd> userfault_register_own(uint64_t addr, uint64_t len)
{
	UniqueFd fd(static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)));
	if (!fd.valid())
		return errno_error("%s", "userfaultfd");
	uffdio_api api{};
	api.api = UFFD_API;
	api.features = UFFD_FEATURE_MINOR_SHMEM;
	if (ioctl(fd.get(), UFFDIO_API, &api) != 0)
		return errno_error("%s", "UFFDIO_API (minor faults on shared memory)");
	uffdio_register reg{};
	reg.range = {addr, len};
	reg.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR;
	if (ioctl(fd.get(), UFFDIO_REGISTER, &reg) != 0)
		return errno_error("UFFDIO_REGISTER %#" PRIx64 "-%#" PRIx64, addr, addr + len);
	return fd;
}

} // namespace cuda_criu
