// What our image holds, as plain C++ data, typed: image.h converts it to and from the file (where GPUs
// and states are text) and refuses what does not convert.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/gpu.h"
#include "base/memory_range.h"

namespace cuda_criu {

struct GpuRecord {
	GpuUuid uuid; // on disk: "GPU-..." text
	std::string name;
	uint64_t memory_bytes = 0;
	std::string pci_bus_id;
	int ordinal = -1;
};

struct ProcessRecord {
	int pid = 0;
	int ns_pid = 0;
	// On disk "running", "locked" or "checkpointed"; absent where the writer left it out.
	std::optional<CudaState> initial_state;
	std::vector<GpuUuid> gpu_uuids;
	uint64_t state_bytes = 0;
	uint64_t lock_us = 0;
	uint64_t checkpoint_us = 0;
	// Private anonymous memory the driver's checkpoint mapped in the process (its copy of the GPU state),
	// which the driver's restore reads once and unmaps: CRIU may map it from the image.
	std::vector<MemoryRange> checkpoint_ranges{}; // {}: aggregate initialisers may leave it out
	// The pages of regular files it had mapped and in use (os/file_pages.h), read ahead at restore.
	std::vector<MemoryRange> file_pages{};
};

struct ImageRecord {
	uint32_t version = 0;
	std::string driver_version;
	std::string plugin_version;
	std::vector<GpuRecord> gpus;       // every GPU a process below held
	std::vector<GpuRecord> other_gpus; // the dumping machine's other GPUs
	std::vector<ProcessRecord> processes;
	uint64_t device_phase_us = 0;
	uint64_t created_unix = 0;
	std::string hostname;
	// Set when the plugin stored the GPU state itself (cuda-gpu.img and its data files; image/gpu_image.h)
	// and CRIU's pages images lack it.
	std::string gpu_image_id;
	// Set when CRIU's pages images hold the GPU state and cuda-gpu.img holds checksums of it.
	std::string gpu_checksums_id;
};

} // namespace cuda_criu
