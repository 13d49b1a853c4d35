// Microseconds of a steady clock: the one time source of the plugin's phase timings.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace cuda_criu {

inline uint64_t now_us()
{
	return static_cast<uint64_t>(
		std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
			.count());
}

// Microseconds of CPU the calling thread has used.
inline uint64_t thread_cpu_us()
{
	timespec ts{};
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return static_cast<uint64_t>(ts.tv_sec) * 1000000 + static_cast<uint64_t>(ts.tv_nsec) / 1000;
}

// Where a pool's workers spend their time, summed over the workers: reading, encoding or decoding and
// checking, writing; and their CPU time. A step far slower than the machine's rate for it, or CPU time
// far below the wall time, is what the log line built from it shows (pools of gpu_store.cpp).
struct StepTimes {
	uint64_t read_us = 0, code_us = 0, write_us = 0, cpu_us = 0;

	StepTimes &operator+=(const StepTimes &o)
	{
		read_us += o.read_us;
		code_us += o.code_us;
		write_us += o.write_us;
		cpu_us += o.cpu_us;
		return *this;
	}
};

// One worker's clock: lap(step) adds the time since the last lap to that step.
class StepClock {
public:
	explicit StepClock(StepTimes &into) : into_(into), last_(now_us()), cpu0_(thread_cpu_us()) {}
	~StepClock() { into_.cpu_us += thread_cpu_us() - cpu0_; }
	StepClock(const StepClock &) = delete;
	StepClock &operator=(const StepClock &) = delete;
	void lap(uint64_t StepTimes::*step)
	{
		uint64_t now = now_us();
		into_.*step += now - last_;
		last_ = now;
	}

private:
	StepTimes &into_;
	uint64_t last_, cpu0_;
};

} // namespace cuda_criu
