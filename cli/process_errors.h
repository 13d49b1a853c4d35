// Driver errors about a process, with the reason a user can act on when there is a plainer one: the
// process is gone, or it is not a CUDA process at all.
#pragma once

#include <sys/types.h>

#include "base/result.h"

namespace cuda_criu::cli {

// error, or "no such process" (ESRCH) when pid does not exist, or error with "(pid N has no libcuda
// mapped: not a CUDA process)" appended when it exists without the driver library.
Error explain_process_error(pid_t pid, const Error &error);

} // namespace cuda_criu::cli
