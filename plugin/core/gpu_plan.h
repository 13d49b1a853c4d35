// Where the GPUs of an image go on this machine: validation before anything is restored, and the
// GPU UUID pairs the driver needs to restore onto other GPUs (driver r580).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/gpu.h"
#include "base/result.h"
#include "core/device_map.h"
#include "image/record.h"

namespace cuda_criu {

struct GpuPlan {
	std::vector<GpuPair> pairs; // empty: every GPU is restored onto itself; with a device map, always all
	std::string description;    // "GPU-aa.. -> GPU-bb.. (automatic: same model)" for the log
	std::map<GpuUuid, uint64_t> need; // the GPU state restored onto each target GPU
	// The same by process (its pid in its namespace, as the image numbers it) and target GPU: what each
	// process's restore allocates, so that its reservation can end with its restore (os/gpu_ledger.h).
	std::map<int, std::map<GpuUuid, uint64_t>> need_by_process;
};

// The image's NVIDIA driver version against this machine's kernel module version ("" when unknown: no
// check; so is an image that recorded only a CUDA version). A CUDA process restores only under the
// driver it was dumped with: its mapped driver libraries and its GPU state belong to that version.
Status check_driver_version(const ImageRecord &image, const std::string &here);

// image: what the dump recorded; here: the GPUs this restore may place processes on (the driver's list,
// so CUDA_VISIBLE_DEVICES in CRIU's environment narrows it); machine: every GPU of this machine, hidden
// ones too (empty: the same as here); map: the user's device map (UUIDs, or indices: OLD the GPU's
// ordinal on the dumping machine, NEW on this one), empty for automatic. Rules, in order:
//  - with a map: each OLD must be a GPU of the image and each NEW a GPU here, no NEW twice; GPUs of the
//    image left out of the map stay on themselves and must be here;
//  - without: GPUs present here (same UUID) stay; the others are paired with unused GPUs of the same
//    model, both sides in ordinal order; none of that model left -> refused;
//  - every target GPU must have room for the GPU state the processes restored onto it bring
//    (memory_bytes and free_bytes of the target, when known); a process's state counts evenly over the
//    GPUs it held, as the image does not say how it was spread (sums saturate: no image wraps them);
//  - when any GPU moves, the dumping machine's GPUs that no process held (image.other_gpus) are paired
//    too, with GPUs of this machine not yet taken (themselves first, else the same model): the driver
//    wants every GPU it knew of in the process paired, also those hidden from it.
// Errors say what differs and how to fix it.
// Untrusted text from the image (GPU names) is escaped in the messages.
Result<GpuPlan> plan_gpus(const ImageRecord &image, const std::vector<GpuInfo> &here, const std::vector<GpuInfo> &machine,
			  const DeviceMap &map);

// The same rules for a live process of this machine (cuda-criu restore/resume --device-map): OLD and
// NEW both name GPUs here (indices: CUDA ordinals in `here`); the GPUs the map leaves out are the ones
// "no process held". Returns every pair the driver needs.
Result<std::vector<GpuPair>> plan_live_device_map(const DeviceMap &map, const std::vector<GpuInfo> &here,
						  const std::vector<GpuInfo> &machine);

} // namespace cuda_criu
