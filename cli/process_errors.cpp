#include "process_errors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "os/proc.h"

namespace cuda_criu::cli {

Error explain_process_error(pid_t pid, const Error &error)
{
	if (!process_exists(pid))
		return make_error(ESRCH, "no such process");
	// Another user's process: its maps cannot be read either, so say what is missing rather than
	// "not a CUDA process". /proc/PID is owned by the process's effective uid.
	struct stat st {};
	const uid_t me = geteuid();
	if (me != 0 && ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) == 0 && st.st_uid != me)
		return make_error(EPERM, "%s (pid %d belongs to uid %u, not to uid %u: run as root, or as its owner)",
				  error.message().c_str(), pid, static_cast<unsigned>(st.st_uid),
				  static_cast<unsigned>(me));
	if (!maps_libcuda(pid))
		return make_error(error.errno_value(), "%s (pid %d has no libcuda mapped: not a CUDA process)",
				  error.message().c_str(), pid);
	return error;
}

} // namespace cuda_criu::cli
