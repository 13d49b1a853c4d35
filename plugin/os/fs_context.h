// A file-system context (fs_struct) of a thread's own, away from CRIU's.
#pragma once

#include <functional>

namespace cuda_criu {

// Gives the calling thread an fs_struct of its own (unshare(CLONE_FS)). Threads share the fs_struct of
// the thread that created them, and CRIU's setns() into a container's mount namespace (needed to dump
// its over-mounted /dev tmpfs) fails with EINVAL while its fs_struct is shared: every thread the plugin
// starts inside CRIU calls this first, and so do the threads a driver library starts from such a thread.
void use_own_fs_context();

// Runs fn on a new thread that has called use_own_fs_context(), and waits for it: for a driver library's
// initialisation (cuInit, nvmlInit), which starts threads of its own in the calling process.
void run_with_own_fs(const std::function<void()> &fn);

} // namespace cuda_criu
