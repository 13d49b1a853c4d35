// What the two halves of cuda-criu inspect share: the description of an image (inspect.cpp) and its
// verification (inspect_verify.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "image/record.h"

namespace cuda_criu::cli {

// inspect --verify DIR (dir_fd: DIR, open): one line per check, or JSON; returns the exit status.
int inspect_verify(const std::string &dir, int dir_fd, bool json);

inline uint64_t range_bytes(const std::vector<MemoryRange> &ranges)
{
	uint64_t n = 0;
	for (const MemoryRange &r : ranges)
		n += r.end - r.start;
	return n;
}

inline double gb_per_s(uint64_t bytes, uint64_t us)
{
	return static_cast<double>(bytes) / 1e3 / static_cast<double>(std::max<uint64_t>(us, 1));
}

} // namespace cuda_criu::cli
