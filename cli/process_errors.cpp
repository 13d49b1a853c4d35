#include "process_errors.h"

#include "os/proc.h"

namespace cuda_criu::cli {

Error explain_process_error(pid_t pid, const Error &error)
{
	if (!process_exists(pid))
		return make_error(ESRCH, "no such process");
	if (!maps_libcuda(pid))
		return make_error(error.errno_value(), "%s (pid %d has no libcuda mapped: not a CUDA process)",
				  error.message().c_str(), pid);
	return error;
}

} // namespace cuda_criu::cli
