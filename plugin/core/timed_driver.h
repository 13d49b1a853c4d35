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

	Result<pid_t> restore_thread_id(pid_t pid) override { return timed([&] { return inner_.restore_thread_id(pid); }); }
	Result<CudaState> state(pid_t pid) override { return timed([&] { return inner_.state(pid); }); }
	Status lock(pid_t pid, unsigned timeout_ms) override { return timed([&] { return inner_.lock(pid, timeout_ms); }); }
	Status checkpoint(pid_t pid) override { return timed([&] { return inner_.checkpoint(pid); }); }
	Status restore(pid_t pid, const std::vector<GpuPair> &pairs) override
	{
		return timed([&] { return inner_.restore(pid, pairs); });
	}
	Status unlock(pid_t pid) override { return timed([&] { return inner_.unlock(pid); }); }
	std::string version() const override { return inner_.version(); }
	Result<std::vector<GpuInfo>> gpus() override { return timed([&] { return inner_.gpus(); }); }
	uint64_t free_bytes(const GpuUuid &uuid) override { return timed([&] { return inner_.free_bytes(uuid); }); }
	std::optional<std::map<pid_t, uint64_t>> gpu_bytes_by_process() override
	{
		return timed([&] { return inner_.gpu_bytes_by_process(); });
	}
	std::optional<std::map<pid_t, std::vector<GpuUuid>>> gpus_by_process() override
	{
		return timed([&] { return inner_.gpus_by_process(); });
	}

private:
	Driver &inner_;
	mutable std::mutex mu_;
	std::vector<std::pair<uint64_t, uint64_t>> calls_;
};

} // namespace cuda_criu
