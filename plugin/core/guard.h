// The dump guard: a small process that outlives CRIU. If CRIU dies in the middle of a dump (SIGKILL, a
// crash) after the plugin locked or checkpointed processes, nothing of CRIU's rollback runs; the guard
// notices (its pipe from CRIU closes without a release) and returns each process to the state it was found
// in (and says so in syslog). A dump that ends normally releases it and it exits.
#pragma once

#include <sys/types.h>

#include <string>

#include "base/result.h"
#include "driver/driver.h"
#include "os/unique_fd.h"

namespace cuda_criu {

class DumpGuard {
public:
	// Must run before libcuda is loaded into this process: the guard is forked from it and loads its own
	// copy of the driver only if it has to act. libcuda: the driver library path (empty: the default).
	static Result<DumpGuard> start(const std::string &libcuda);

	DumpGuard() = default;
	DumpGuard(DumpGuard &&) = default;
	DumpGuard &operator=(DumpGuard &&) = default;
	~DumpGuard() { release(); } // a normal end of the dump; only a dead CRIU skips it
	// Tells the guard about a process about to be locked, and the state it was found in.
	void watch(pid_t pid, CudaState found);
	// The dump is over and every process is where it should be: the guard exits.
	void release();

private:
	explicit DumpGuard(UniqueFd pipe) : pipe_(std::move(pipe)) {}
	UniqueFd pipe_;
};

} // namespace cuda_criu
