#include "core/gpu_plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "base/text.h"

namespace cuda_criu {
namespace {

const char *const kHint = "set CUDA_CRIU_DEVICE_MAP=OLD=NEW,... (GPU UUIDs or indices) to choose the GPUs";

// Where each GPU of the dump goes, and why (for the log).
struct Target {
	const GpuInfo *gpu = nullptr;
	std::string how;
};

// The plan as it is built: the dump's GPUs (held by a process, and the others the dumping machine had)
// placed onto this machine's GPUs.
struct Placement {
	std::map<GpuUuid, Target> targets; // GPU of the dump -> GPU here
	std::set<GpuUuid> used;            // GPUs here already taken
};

std::string list_here(const std::vector<GpuInfo> &here)
{
	if (here.empty())
		return "none";
	std::string out;
	for (const GpuInfo &g : here)
		out += format("%s%d: %s %s", out.empty() ? "" : ", ", g.ordinal, g.uuid.str().c_str(), printable(g.name).c_str());
	return out;
}

const GpuInfo *find_here(const std::vector<GpuInfo> &here, const GpuUuid &uuid)
{
	for (const GpuInfo &g : here)
		if (g.uuid == uuid)
			return &g;
	return nullptr;
}

const GpuInfo *find_ref(const std::vector<GpuInfo> &gpus, const GpuRef &ref)
{
	auto it = std::find_if(gpus.begin(), gpus.end(), [&](const GpuInfo &g) { return ref.matches(g.uuid, g.ordinal); });
	return it == gpus.end() ? nullptr : &*it;
}

// The map's pairs: each OLD a GPU of the dump (UUID or its ordinal there; a GPU some process held, or one
// of the dumping machine's others, which the driver wants paired too), each NEW a GPU here (UUID or ordinal
// here), no GPU here twice. A GPU no process held may also go to a GPU of this machine hidden from CRIU
// (`all`): inside a container's device cgroup CRIU sees only the container's GPUs, while the driver still
// wants the others paired.
Status place_mapped(const DeviceMap &map, const std::vector<GpuRecord> &held, const std::vector<GpuRecord> &others,
		    const std::vector<GpuInfo> &here, const std::vector<GpuInfo> &all, Placement &p)
{
	for (const DeviceMap::Entry &e : map.entries) {
		auto matches = [&](const GpuRecord &g) { return e.from.matches(g.uuid, g.ordinal); };
		auto from = std::find_if(held.begin(), held.end(), matches);
		const bool held_gpu = from != held.end();
		if (!held_gpu) {
			from = std::find_if(others.begin(), others.end(), matches);
			if (from == others.end())
				return make_error(EINVAL,
						  "device map: %s is not a GPU of the image (it has %zu: %s); map only the GPUs "
						  "`cuda-criu inspect` lists for the image (a process in a container knew only "
						  "the GPUs of its /dev)",
						  e.from.str().c_str(), held.size() + others.size(),
						  held.empty() ? "none" : held[0].uuid.str().c_str());
		}
		const GpuInfo *to = find_ref(here, e.to);
		if (!to && !held_gpu && e.to.uuid) // by UUID only: ordinals name the GPUs CRIU sees
			to = find_ref(all, e.to);
		if (!to && find_ref(all, e.to))
			return make_error(ENODEV,
					  "device map: GPU %s is on this machine but hidden from CRIU (GPUs CRIU sees: %s): "
					  "CUDA_VISIBLE_DEVICES in CRIU's environment, or the container's devices, must "
					  "include it",
					  e.to.str().c_str(), list_here(here).c_str());
		if (!to)
			return make_error(ENODEV, "device map: GPU %s is not on this machine (GPUs here: %s)", e.to.str().c_str(),
					  list_here(here).c_str());
		if (p.targets.count(from->uuid))
			return make_error(EINVAL, "device map: %s is mapped twice", from->uuid.str().c_str());
		if (!p.used.insert(to->uuid).second)
			return make_error(EINVAL, "device map: two GPUs of the image are mapped onto %s", to->uuid.str().c_str());
		p.targets[from->uuid] = {to, "device map"};
	}
	return {};
}

// The dump's GPUs the map left out: themselves if present, else (without a map) a free GPU of the same
// model, both sides in ordinal order.
Status place_unmapped(const std::vector<GpuRecord> &held, const std::vector<GpuInfo> &here, bool with_map, Placement &p)
{
	std::vector<const GpuRecord *> unplaced;
	for (const GpuRecord &g : held) {
		if (p.targets.count(g.uuid))
			continue;
		const GpuInfo *same = find_here(here, g.uuid);
		if (same && p.used.insert(g.uuid).second) {
			p.targets[g.uuid] = {same, ""};
			continue;
		}
		if (with_map)
			return make_error(ENODEV, "GPU %s (%s) of the image is %s and not in the device map: map it too; %s",
					  g.uuid.str().c_str(), printable(g.name).c_str(),
					  same ? "taken by another pair of the map" : "not on this machine", kHint);
		unplaced.push_back(&g);
	}
	std::sort(unplaced.begin(), unplaced.end(), [](const GpuRecord *a, const GpuRecord *b) { return a->ordinal < b->ordinal; });
	for (const GpuRecord *g : unplaced) {
		auto pick = std::find_if(here.begin(), here.end(), // `here` is in ordinal order
					 [&](const GpuInfo &h) { return !p.used.count(h.uuid) && h.name == g->name; });
		if (pick == here.end()) {
			size_t needed = std::count_if(held.begin(), held.end(), [&](const GpuRecord &r) { return r.name == g->name; });
			return make_error(ENODEV,
					  "the image needs %zu x %s (it ran on %s); this machine has no free GPU of that "
					  "model (GPUs here: %s): restore on a machine with such GPUs, or %s",
					  needed, printable(g->name).c_str(), g->uuid.str().c_str(), list_here(here).c_str(), kHint);
		}
		p.targets[g->uuid] = {&*pick, "automatic: same model"};
		p.used.insert(pick->uuid);
	}
	return {};
}

uint64_t add_saturated(uint64_t a, uint64_t b) { return b > std::numeric_limits<uint64_t>::max() - a ? std::numeric_limits<uint64_t>::max() : a + b; }

// Room for the GPU state on each target: a process's state counts evenly over the GPUs it held. Sums
// saturate, so that an image's sizes cannot wrap around the check.
Status check_room(const std::vector<ProcessRecord> &processes, const Placement &p, GpuPlan &plan)
{
	std::map<const GpuInfo *, uint64_t> need;
	for (const ProcessRecord &proc : processes)
		for (const GpuUuid &u : proc.gpu_uuids)
			if (auto t = p.targets.find(u); t != p.targets.end()) {
				uint64_t share = proc.state_bytes / proc.gpu_uuids.size();
				need[t->second.gpu] = add_saturated(need[t->second.gpu], share);
				uint64_t &mine = plan.need_by_process[proc.ns_pid][t->second.gpu->uuid];
				mine = add_saturated(mine, share);
			}
	for (const auto &[g, bytes] : need) {
		plan.need[g->uuid] = bytes;
		if (g->memory_bytes && bytes > g->memory_bytes)
			return make_error(ENOSPC,
					  "GPU %d (%s, %s) has %s of memory; the processes restored onto it need %s: "
					  "restore on a larger GPU, or spread them with CUDA_CRIU_DEVICE_MAP",
					  g->ordinal, g->uuid.str().c_str(), printable(g->name).c_str(),
					  human_bytes(g->memory_bytes).c_str(), human_bytes(bytes).c_str());
		if (g->free_bytes && bytes > g->free_bytes)
			return make_error(ENOSPC,
					  "GPU %d (%s, %s) has %s free now (of %s); the processes restored onto it need %s: "
					  "end what uses that GPU's memory, or restore onto another GPU with "
					  "CUDA_CRIU_DEVICE_MAP",
					  g->ordinal, g->uuid.str().c_str(), printable(g->name).c_str(),
					  human_bytes(g->free_bytes).c_str(), human_bytes(g->memory_bytes).c_str(),
					  human_bytes(bytes).c_str());
	}
	return {};
}

void describe(GpuPlan &plan, const std::string &what)
{
	plan.description += (plan.description.empty() ? "" : ", ") + what;
}

// Once any GPU moves, the driver wants every GPU it knew of paired: the dumping machine's GPUs no
// process held go to what is left of this machine, themselves first, else the same model.
void pair_all(const std::vector<GpuRecord> &held, const std::vector<GpuRecord> &others, const std::vector<GpuInfo> &all,
	      Placement &p, GpuPlan &plan)
{
	std::vector<const GpuRecord *> listed;
	listed.reserve(held.size() + others.size());
	for (const GpuRecord &g : held)
		listed.push_back(&g);
	for (const GpuRecord &g : others) {
		if (p.targets.count(g.uuid)) { // the device map placed it
			listed.push_back(&g);
			continue;
		}
		const GpuInfo *pick = nullptr;
		for (const GpuInfo &h : all)
			if (!p.used.count(h.uuid) && (h.uuid == g.uuid || (!pick && h.name == g.name)))
				pick = &h;
		if (!pick) {
			describe(plan, format("GPU %s, held by no process, left unpaired: no GPU of that model left here",
					      g.uuid.str().c_str()));
			continue;
		}
		p.targets[g.uuid] = {pick, "held by no process"};
		p.used.insert(pick->uuid);
		listed.push_back(&g);
	}
	for (const GpuRecord *g : listed) {
		const Target &t = p.targets[g->uuid];
		plan.pairs.push_back({g->uuid, t.gpu->uuid});
		if (g->uuid != t.gpu->uuid)
			describe(plan, format("%s -> %s (%s)", g->uuid.str().c_str(), t.gpu->uuid.str().c_str(), t.how.c_str()));
	}
}

Result<GpuPlan> plan(const std::vector<GpuRecord> &held, const std::vector<GpuRecord> &others,
		     const std::vector<ProcessRecord> &processes, const std::vector<GpuInfo> &here,
		     const std::vector<GpuInfo> &machine, const DeviceMap &map)
{
	Placement p;
	if (auto st = place_mapped(map, held, others, here, machine.empty() ? here : machine, p); !st)
		return std::move(st).error();
	if (auto st = place_unmapped(held, here, !map.empty(), p); !st)
		return std::move(st).error();
	GpuPlan out;
	if (auto st = check_room(processes, p, out); !st)
		return std::move(st).error();
	bool moved = std::any_of(p.targets.begin(), p.targets.end(), [](const auto &kv) { return kv.first != kv.second.gpu->uuid; });
	if (!moved && map.empty())
		return out; // an explicit map is always handed to the driver, even onto the same GPUs
	if (!moved)
		out.description = "onto the same GPUs (device map)";
	pair_all(held, others, machine.empty() ? here : machine, p, out);
	return out;
}

} // namespace

Status check_driver_version(const ImageRecord &image, const std::string &here)
{
	const std::string then = printable(image.driver_version);
	if (here.empty() || then.empty() || then.rfind("CUDA ", 0) == 0 || then == here)
		return {};
	return make_error(EPROTO,
			  "the image was dumped under NVIDIA driver %s and this machine runs %s: a CUDA process "
			  "restores only under the driver it was dumped with (its mapped driver libraries and its GPU "
			  "state belong to that version); restore on a machine with driver %s, or install it here",
			  then.c_str(), here.c_str(), then.c_str());
}

Result<GpuPlan> plan_gpus(const ImageRecord &image, const std::vector<GpuInfo> &here, const std::vector<GpuInfo> &machine,
			  const DeviceMap &map)
{
	return plan(image.gpus, image.other_gpus, image.processes, here, machine, map);
}

Result<std::vector<GpuPair>> plan_live_device_map(const DeviceMap &map, const std::vector<GpuInfo> &here,
						  const std::vector<GpuInfo> &machine)
{
	const std::vector<GpuInfo> &all = machine.empty() ? here : machine;
	std::vector<GpuRecord> held, others;
	auto index_here = [&](const GpuRef &ref) {
		return ref.uuid || std::any_of(here.begin(), here.end(), [&](const GpuInfo &g) { return g.ordinal == ref.index; });
	};
	for (const DeviceMap::Entry &e : map.entries) {
		for (const GpuRef *ref : {&e.from, &e.to})
			if (!index_here(*ref))
				return make_error(ENODEV, "device map '%s': there is no GPU %s here (%zu GPU(s))", map.str().c_str(),
						  ref->str().c_str(), here.size());
		auto from = std::find_if(here.begin(), here.end(), [&](const GpuInfo &g) { return e.from.matches(g.uuid, g.ordinal); });
		GpuUuid uuid = from != here.end() ? from->uuid : *e.from.uuid;
		const GpuInfo *known = find_here(all, uuid);
		// Indices here are this machine's CUDA ordinals, which the held GPUs keep.
		held.push_back({uuid, known ? known->name : std::string(), 0, "", from != here.end() ? from->ordinal : -1});
	}
	for (const GpuInfo &g : all)
		if (std::none_of(held.begin(), held.end(), [&](const GpuRecord &h) { return h.uuid == g.uuid; }))
			others.push_back({g.uuid, g.name, 0, "", -1});
	auto p = plan(held, others, {}, here, machine, map);
	if (!p)
		return std::move(p).error();
	return std::move(p->pairs);
}

} // namespace cuda_criu
