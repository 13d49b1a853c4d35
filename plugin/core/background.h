// Work a restore starts at POST_FORKING, on a thread of its own, while CRIU restores memory: the driver's
// load (libcuda and NVML) and the check of the GPU image CRIU maps.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

namespace cuda_criu {

class Background {
public:
	// Starts the thread, which first runs own_fs (takes an fs_struct of its own: CRIU's setns() into a
	// restored container's mount namespace fails while a thread shares its fs_struct; threads it starts
	// share its own), then work. Returns once own_fs has run, or after own_fs_wait_ms. The thread is never
	// joined, so that a wedged cuInit cannot hold CRIU: it shares the task, which outlives whoever waits
	// for it.
	static std::shared_ptr<Background> start(std::function<void()> own_fs, std::function<void()> work,
						 unsigned own_fs_wait_ms);

	// true once the work returned; false when it did not within timeout_ms. After one wait in vain, later
	// waits do not wait again.
	bool wait(unsigned timeout_ms);
	// true once the work returned, after waiting at most timeout_ms; unlike wait(), every call waits (for a
	// waiter that does other work between its waits).
	bool done_within(unsigned timeout_ms);

private:
	std::mutex mu_;
	std::condition_variable cv_;
	bool own_fs_ = false; // the thread no longer shares CRIU's fs_struct
	bool done_ = false;
	bool given_up_ = false;
};

} // namespace cuda_criu
