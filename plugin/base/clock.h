// Microseconds of a steady clock: the one time source of the plugin's phase timings.
#pragma once

#include <chrono>
#include <cstdint>

namespace cuda_criu {

inline uint64_t now_us()
{
	return static_cast<uint64_t>(
		std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
			.count());
}

} // namespace cuda_criu
