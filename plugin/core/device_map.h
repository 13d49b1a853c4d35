// The user's GPU map for a restore, "OLD=NEW,...": parsed once, from the plugin's device-map option or
// cuda-criu's --device-map, and handed to the GPU plan (core/gpu_plan.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/gpu.h"
#include "base/result.h"

namespace cuda_criu {

// One side of an entry: a GPU UUID ("GPU-xxxxxxxx-...", as nvidia-smi -L prints it) or an index (an
// ordinal: which machine's depends on the side and on the caller, see plan_gpus).
struct GpuRef {
	std::optional<GpuUuid> uuid; // set for a UUID; otherwise index is
	int index = -1;

	bool matches(const GpuUuid &gpu, int ordinal) const { return uuid ? *uuid == gpu : index == ordinal; }
	std::string str() const; // as the user wrote it (UUIDs in nvidia-smi's lower case)
};

struct DeviceMap {
	struct Entry {
		GpuRef from; // a GPU of the dump
		GpuRef to;   // the GPU to restore it onto
	};
	std::vector<Entry> entries;

	bool empty() const { return entries.empty(); }
	std::string str() const; // "OLD=NEW,..."

	// "OLD=NEW[,OLD=NEW...]" with UUIDs or indices (0-999); empty text: an empty map. Errors name the
	// entry; the same OLD twice is an error.
	static Result<DeviceMap> parse(const std::string &text);
};

} // namespace cuda_criu
