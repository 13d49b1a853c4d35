// A range of a process's address space: what the image records of the driver's copy of the GPU state
// (image/record.h) and what the process's memory map shows (os/maps.h).
#pragma once

#include <cstdint>

namespace cuda_criu {

// [start, end) in a process's address space.
struct MemoryRange {
	uint64_t start = 0;
	uint64_t end = 0;
	bool operator==(const MemoryRange &) const = default;
};

} // namespace cuda_criu
