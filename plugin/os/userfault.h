// A userfaultfd of another process (one CRIU opened in a restored task, criu-patches/0010): its ranges are
// registered for missing and minor faults on memory mapped from a file, and each first touch of a page
// waits until the plugin maps the page from the file's page cache (UFFDIO_CONTINUE).
#pragma once

#include <cstdint>
#include <vector>

#include "base/result.h"
#include "os/unique_fd.h"

namespace cuda_criu {

class Userfault {
public:
	explicit Userfault(UniqueFd fd) : fd_(std::move(fd)) {}
	int fd() const { return fd_.get(); }

	// The addresses of the faults waiting to be read (non-blocking: none, empty); an error where the
	// descriptor cannot be read.
	Result<std::vector<uint64_t>> read_faults();
	// Maps [addr, addr + len) of the registered range from the file's pages and wakes whoever waits for
	// them; pages mapped already are left as they are.
	Status map_from_file(uint64_t addr, uint64_t len);
	// Wakes whoever waits for a page of [addr, addr + len) (mapped since its fault was raised).
	Status wake(uint64_t addr, uint64_t len);
	// Ends the registration of [addr, addr + len) and wakes its waiters: a later touch maps the file's
	// page as usual. ESRCH where the process has gone.
	Status unregister(uint64_t addr, uint64_t len);

private:
	UniqueFd fd_;
};

// Registers [addr, addr + len) of this process with a new userfaultfd for missing and minor faults, as
// CRIU's restorer does for a task (for tests).
Result<UniqueFd> userfault_register_own(uint64_t addr, uint64_t len);

} // namespace cuda_criu
