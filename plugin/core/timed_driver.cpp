#include "core/timed_driver.h"

#include <algorithm>

namespace cuda_criu {

uint64_t TimedDriver::covered_us(uint64_t from, uint64_t to) const
{
	std::vector<std::pair<uint64_t, uint64_t>> in;
	{
		std::lock_guard<std::mutex> g(mu_);
		for (auto [a, b] : calls_)
			if (b > from && a < to)
				in.emplace_back(std::max(a, from), std::min(b, to));
	}
	std::sort(in.begin(), in.end());
	uint64_t total = 0, end = from;
	for (auto [a, b] : in) {
		a = std::max(a, end);
		if (b > a) {
			total += b - a;
			end = b;
		}
	}
	return total;
}

} // namespace cuda_criu
