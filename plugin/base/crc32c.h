// CRC-32C (Castagnoli), the checksum of every chunk of GPU state the plugin stores: the SSE4.2 crc32
// instruction where the processor has it (about 8 GB/s a thread), a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cuda_criu {

// The CRC-32C of data[0, len), continuing from crc (0 to start).
uint32_t crc32c(const void *data, size_t len, uint32_t crc = 0);

} // namespace cuda_criu
