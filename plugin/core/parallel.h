// Runs independent jobs (driver calls for different processes) on worker threads.
#pragma once

#include <functional>
#include <utility>
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
// Watches the jobs while they run: called on the waiting thread every watch_every_ms with, for each job,
// whether it has ended; it returns the jobs to give up now (index and error), e.g. a copy that stalled.
using JobWatch = std::function<std::vector<std::pair<size_t, Error>>(const std::vector<bool> &ended)>;
// Work the waiting thread must do promptly while the jobs run (the stops of traced threads): called
// between its waits, as often as it returns true and every 200 us otherwise.
using JobTend = std::function<bool()>;
std::vector<Status> run_jobs(std::vector<Job> jobs, unsigned max_parallel, unsigned timeout_ms,
			     const JobWatch &watch = {}, unsigned watch_every_ms = 500, const JobTend &tend = {});

} // namespace cuda_criu
