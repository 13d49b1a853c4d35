// Driver errors about a process, with the reason a user can act on when there is a plainer one: the
// process is gone, it is another user's, or it is not a CUDA process at all.
#pragma once

#include <sys/types.h>

#include "base/result.h"

namespace cuda_criu::cli {

// error, or "no such process" (ESRCH) when pid does not exist, or error with "(pid N belongs to uid U,
// not to uid V: run as root, or as its owner)" appended (EPERM) when a caller other than root drives
// another user's process, or with "(pid N has no libcuda mapped: not a CUDA process)" when it exists
// without the driver library.
Error explain_process_error(pid_t pid, const Error &error);

} // namespace cuda_criu::cli
