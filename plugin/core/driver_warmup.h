// The driver warm-up of a restore (POST_FORKING): libcuda and NVML are loaded on a thread of their own
// while CRIU restores memory, instead of at the first RESUME_DEVICES_LATE.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

namespace cuda_criu {

class DriverWarmup {
public:
	// Starts the thread, which first runs own_fs (takes an fs_struct of its own: CRIU's setns() into a
	// restored container's mount namespace fails while a thread shares its fs_struct), then load. Returns
	// once own_fs has run, or after own_fs_wait_ms. The thread is never joined, so that a wedged cuInit
	// cannot hold CRIU: it shares the warm-up, which outlives whoever waits for it.
	static std::shared_ptr<DriverWarmup> start(std::function<void()> own_fs, std::function<void()> load,
						   unsigned own_fs_wait_ms);

	// true once the loads returned; false when they did not within timeout_ms. After one wait in vain,
	// later waits do not wait again.
	bool wait(unsigned timeout_ms);

private:
	std::mutex mu_;
	std::condition_variable cv_;
	bool own_fs_ = false; // the thread no longer shares CRIU's fs_struct
	bool done_ = false;
	bool given_up_ = false;
};

} // namespace cuda_criu
