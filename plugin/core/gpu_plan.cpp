#include "core/gpu_plan.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

namespace cuda_criu {
namespace {

std::string gib(uint64_t b)
{
	if (b < (1ULL << 30))
		return format("%.1f MiB", static_cast<double>(b) / (1ULL << 20));
	return format("%.1f GiB", static_cast<double>(b) / (1ULL << 30));
}

bool is_index(const std::string &s)
{
	return !s.empty() && s.size() < 4 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string list_here(const std::vector<GpuInfo> &here)
{
	if (here.empty())
		return "none";
	std::string out;
	for (const GpuInfo &g : here)
		out += format("%s%d: %s %s", out.empty() ? "" : ", ", g.ordinal, g.uuid.str().c_str(), g.name.c_str());
	return out;
}

} // namespace

Status check_driver_version(const ImageRecord &image, const std::string &here)
{
	const std::string &then = image.driver_version;
	if (here.empty() || then.empty() || then.rfind("CUDA ", 0) == 0 || then == here)
		return {};
	return make_error(EPROTO,
			  "the image was dumped under NVIDIA driver %s and this machine runs %s: a CUDA process "
			  "restores only under the driver it was dumped with (its mapped driver libraries and its GPU "
			  "state belong to that version); restore on a machine with driver %s, or install it here",
			  then.c_str(), here.c_str(), then.c_str());
}

Result<GpuPlan> plan_gpus(const ImageRecord &image, const std::vector<GpuInfo> &here, const std::vector<GpuInfo> &machine,
			  const std::string &device_map)
{
	auto find_here = [&](const std::string &uuid) -> const GpuInfo * {
		for (const GpuInfo &g : here)
			if (g.uuid.str() == uuid)
				return &g;
		return nullptr;
	};
	auto image_gpu = [&](const std::string &key) -> const GpuRecord * {
		for (const GpuRecord &g : image.gpus)
			if (g.uuid == key || (is_index(key) && g.ordinal == std::atoi(key.c_str())))
				return &g;
		return nullptr;
	};
	const std::string hint = "set CUDA_CRIU_DEVICE_MAP=OLD=NEW,... (GPU UUIDs or indices) to choose the GPUs";

	std::map<std::string, const GpuInfo *> target; // image GPU uuid -> GPU here
	std::map<std::string, std::string> how;
	if (!device_map.empty()) {
		size_t pos = 0;
		while (pos <= device_map.size()) {
			size_t comma = device_map.find(',', pos);
			std::string item = device_map.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
			pos = comma == std::string::npos ? device_map.size() + 1 : comma + 1;
			if (item.empty())
				continue;
			size_t eq = item.find('=');
			if (eq == std::string::npos)
				return make_error(EINVAL, "device map '%s': '%s' is not OLD=NEW", device_map.c_str(), item.c_str());
			std::string old_key = item.substr(0, eq), new_key = item.substr(eq + 1);
			const GpuRecord *from = image_gpu(old_key);
			if (!from)
				return make_error(EINVAL, "device map: %s is not a GPU of the image (it has %zu: %s)",
						  old_key.c_str(), image.gpus.size(),
						  image.gpus.empty() ? "none" : image.gpus[0].uuid.c_str());
			const GpuInfo *to = nullptr;
			if (is_index(new_key)) {
				int n = std::atoi(new_key.c_str());
				for (const GpuInfo &g : here)
					if (g.ordinal == n)
						to = &g;
			} else {
				to = find_here(new_key);
			}
			if (!to)
				return make_error(ENODEV, "device map: GPU %s is not on this machine (GPUs here: %s)",
						  new_key.c_str(), list_here(here).c_str());
			target[from->uuid] = to;
			how[from->uuid] = "device map";
		}
	}

	// Image GPUs still unplaced: themselves if present, else a free GPU of the same model.
	std::set<std::string> used;
	for (const auto &[uuid, g] : target)
		if (!used.insert(g->uuid.str()).second)
			return make_error(EINVAL, "device map: two GPUs of the image are mapped onto %s", g->uuid.str().c_str());
	std::vector<const GpuRecord *> unplaced;
	for (const GpuRecord &g : image.gpus) {
		if (target.count(g.uuid))
			continue;
		const GpuInfo *same = find_here(g.uuid);
		if (same && !used.count(g.uuid)) {
			target[g.uuid] = same;
			used.insert(g.uuid);
			continue;
		}
		if (!device_map.empty())
			return make_error(ENODEV, "GPU %s (%s) of the image is %s and not in the device map: map it too; %s",
					  g.uuid.c_str(), g.name.c_str(),
					  same ? "taken by another pair of the map" : "not on this machine", hint.c_str());
		unplaced.push_back(&g);
	}
	std::sort(unplaced.begin(), unplaced.end(),
		  [](const GpuRecord *a, const GpuRecord *b) { return a->ordinal < b->ordinal; });
	for (const GpuRecord *g : unplaced) {
		const GpuInfo *pick = nullptr;
		for (const GpuInfo &h : here) // `here` is in ordinal order
			if (!used.count(h.uuid.str()) && h.name == g->name) {
				pick = &h;
				break;
			}
		if (!pick) {
			size_t needed = std::count_if(image.gpus.begin(), image.gpus.end(),
						      [&](const GpuRecord &r) { return r.name == g->name; });
			return make_error(ENODEV,
					  "the image needs %zu x %s (it ran on %s); this machine has no free GPU of that "
					  "model (GPUs here: %s): restore on a machine with such GPUs, or %s",
					  needed, g->name.c_str(), g->uuid.c_str(), list_here(here).c_str(), hint.c_str());
		}
		target[g->uuid] = pick;
		used.insert(pick->uuid.str());
		how[g->uuid] = "automatic: same model";
	}

	// Room for the GPU state: each process's state is spread over the GPUs it used.
	std::map<std::string, uint64_t> need; // uuid here -> bytes
	for (const ProcessRecord &p : image.processes)
		for (const std::string &u : p.gpu_uuids)
			if (target.count(u))
				need[target[u]->uuid.str()] += p.state_bytes / p.gpu_uuids.size();
	for (const auto &[uuid, bytes] : need) {
		const GpuInfo *g = find_here(uuid);
		if (g && g->memory_bytes && bytes > g->memory_bytes)
			return make_error(ENOSPC,
					  "GPU %d (%s, %s) has %s of memory; the processes restored onto it need %s: "
					  "restore on a larger GPU, or spread them with CUDA_CRIU_DEVICE_MAP",
					  g->ordinal, uuid.c_str(), g->name.c_str(), gib(g->memory_bytes).c_str(),
					  gib(bytes).c_str());
		if (g && g->free_bytes && bytes > g->free_bytes)
			return make_error(ENOSPC,
					  "GPU %d (%s, %s) has %s free now (of %s); the processes restored onto it need %s: "
					  "end what uses that GPU's memory, or restore onto another GPU with "
					  "CUDA_CRIU_DEVICE_MAP",
					  g->ordinal, uuid.c_str(), g->name.c_str(), gib(g->free_bytes).c_str(),
					  gib(g->memory_bytes).c_str(), gib(bytes).c_str());
	}

	GpuPlan plan;
	bool moved = std::any_of(target.begin(), target.end(),
				 [](const auto &kv) { return kv.first != kv.second->uuid.str(); });
	if (!moved && device_map.empty())
		return plan; // an explicit map is always handed to the driver, even onto the same GPUs
	if (!moved)
		plan.description = "onto the same GPUs (device map)";
	// The GPUs no process held: paired with what is left of this machine, themselves first.
	const std::vector<GpuInfo> &all = machine.empty() ? here : machine;
	std::vector<GpuRecord> listed = image.gpus;
	for (const GpuRecord &g : image.other_gpus) {
		const GpuInfo *pick = nullptr;
		for (const GpuInfo &h : all)
			if (!used.count(h.uuid.str()) && (h.uuid.str() == g.uuid || (!pick && h.name == g.name)))
				pick = &h;
		if (!pick) {
			plan.description += format("%sGPU %s, held by no process, left unpaired: no GPU of that model "
						   "left here", plan.description.empty() ? "" : ", ", g.uuid.c_str());
			continue;
		}
		target[g.uuid] = pick;
		used.insert(pick->uuid.str());
		how[g.uuid] = "held by no process";
		listed.push_back(g);
	}
	for (const GpuRecord &g : listed) {
		auto from = GpuUuid::parse(g.uuid);
		if (!from)
			return std::move(from).error().context("%s", "the image's GPU list");
		const GpuInfo *to = target[g.uuid];
		plan.pairs.push_back({*from, to->uuid});
		if (g.uuid != to->uuid.str())
			plan.description += format("%s%s -> %s (%s)", plan.description.empty() ? "" : ", ", g.uuid.c_str(),
						   to->uuid.str().c_str(), how[g.uuid].c_str());
	}
	return plan;
}

} // namespace cuda_criu
