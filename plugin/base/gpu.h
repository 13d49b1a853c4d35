// What identifies a GPU and a process's CUDA state: plain data shared by every layer (the driver fills
// it, the OS layer reads the kernel's GPU list into it, the image records it).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "base/result.h"

namespace cuda_criu {

// Mirrors CUprocessState.
enum class CudaState { Running, Locked, Checkpointed, Failed };
const char *to_string(CudaState state);
// The inverse of to_string ("locked" -> Locked); an error naming the text for anything else.
Result<CudaState> parse_cuda_state(const std::string &text);

struct GpuUuid {
	std::array<uint8_t, 16> bytes{};

	// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
	std::string str() const;
	static Result<GpuUuid> parse(const std::string &text);
	bool operator==(const GpuUuid &) const = default;
	auto operator<=>(const GpuUuid &) const = default;
};

struct GpuPair {
	GpuUuid from; // GPU the process was checkpointed on
	GpuUuid to;   // GPU to restore it onto

	bool operator==(const GpuPair &) const = default;
};

struct GpuInfo {
	int ordinal = 0;
	GpuUuid uuid;
	std::string name;
	uint64_t memory_bytes = 0;
	uint64_t free_bytes = 0;  // free memory when the restore plans its GPUs; 0 = unknown
	std::string pci_bus_id; // "0000:19:00.0", lower case
};

} // namespace cuda_criu
