#include "os/fs_context.h"

#include <sched.h>

#include <thread>

namespace cuda_criu {

void use_own_fs_context()
{
	// Fails only without memory; the thread then shares CRIU's fs_struct, as without this call.
	(void)unshare(CLONE_FS);
}

void run_with_own_fs(const std::function<void()> &fn)
{
	std::thread([&] {
		use_own_fs_context();
		fn();
	}).join();
}

} // namespace cuda_criu
