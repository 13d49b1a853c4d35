// The dump guard: a small process that outlives CRIU. Once CRIU has exited, every CUDA process of the dump
// that is still alive must be in the state it was found in: after a normal dump it is dead, after
// --leave-running or a failed dump the plugin returned it. If not (CRIU died mid-dump, or CRIU let the
// tasks go after a successful dump because a post-dump script asked), the guard returns it there and says
// so in syslog.
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
	// Tells the guard about a process about to be locked, and the state it was found in.
	void watch(pid_t pid, CudaState found);

private:
	explicit DumpGuard(UniqueFd pipe) : pipe_(std::move(pipe)) {}
	UniqueFd pipe_;
};

} // namespace cuda_criu
