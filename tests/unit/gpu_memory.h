// Memory patterns of the GPU image's tests: what a fake process holds before a dump and after a restore.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "fakes.h"

namespace cuda_criu::testing {

// Fills [addr, addr + len) of pid with a pattern that depends on the address and a seed (never a zero byte).
inline void fill(FakeHost &host, pid_t pid, uint64_t addr, size_t len, uint8_t seed)
{
	std::vector<uint8_t> b(len);
	for (size_t i = 0; i < len; i++)
		b[i] = static_cast<uint8_t>((addr + i) * 7 + seed) | 1;
	ASSERT_TRUE(host.write_memory(pid, addr, b.data(), b.size()).ok());
}

inline std::vector<uint8_t> bytes_of(FakeHost &host, pid_t pid, uint64_t addr, size_t len)
{
	std::vector<uint8_t> b(len);
	EXPECT_TRUE(host.read_memory(pid, addr, b.data(), len).ok());
	return b;
}

} // namespace cuda_criu::testing
