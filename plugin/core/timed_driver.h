// Measures the plugin's own overhead: a Driver that forwards every call and records when it ran, so that
// a phase's wall time minus the time covered by driver calls is what the plugin itself spent.
#pragma once

#include <mutex>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "driver/driver.h"

namespace cuda_criu {

class TimedDriver final : public Driver {
	template <typename F>
	auto timed(F &&call) -> decltype(call())
	{
		uint64_t t0 = now_us();
		auto r = call();
		uint64_t t1 = now_us();
		std::lock_guard<std::mutex> g(mu_);
		calls_.emplace_back(t0, t1);
		return r;
	}

public:
	explicit TimedDriver(Driver &inner) : inner_(inner) {}

	// Microseconds in [from, to) covered by at least one driver call (calls may overlap).
	uint64_t covered_us(uint64_t from, uint64_t to) const;

#define CUDA_CRIU_TIMED_CALL(ret, method, params, args) \
	ret method params override { return timed([&] { return inner_.method args; }); }
	CUDA_CRIU_DRIVER_CALLS(CUDA_CRIU_TIMED_CALL)
#undef CUDA_CRIU_TIMED_CALL
	std::string version() const override { return inner_.version(); }

private:
	Driver &inner_;
	mutable std::mutex mu_;
	std::vector<std::pair<uint64_t, uint64_t>> calls_;
};

} // namespace cuda_criu
