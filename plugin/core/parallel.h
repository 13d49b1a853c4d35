// Runs independent jobs (driver calls for different processes) on worker threads.
#pragma once

#include <functional>
#include <vector>

#include "base/result.h"

namespace cuda_criu {

// Runs every job, at most max_parallel at a time (0: all at once), and returns their results in order.
// A job still running timeout_ms after it started (0: no limit) is reported as failed with ETIMEDOUT
// and abandoned: a driver call cannot be cancelled, so its thread is left to finish on its own.
// what: names the operation; every error is prefixed with it ("checkpoint pid 7: ...").
struct Job {
	std::string what;
	std::function<Status()> run;
};
std::vector<Status> run_jobs(std::vector<Job> jobs, unsigned max_parallel, unsigned timeout_ms);

} // namespace cuda_criu
