#include "core/memory_check.h"

#include <map>

#include "base/format.h"
#include "base/log.h"
#include "base/text.h"

namespace cuda_criu {
namespace {

std::string pids_of(const std::vector<const CheckpointNeed *> &needs)
{
	std::string out;
	for (const CheckpointNeed *n : needs)
		out += format("%s%d (%s)", out.empty() ? "" : ", ", n->pid, human_bytes(n->bytes).c_str());
	return out;
}

} // namespace

Status check_checkpoint_memory(const std::vector<CheckpointNeed> &needs, std::optional<uint64_t> host_available)
{
	uint64_t total = 0;
	std::map<std::string, std::vector<const CheckpointNeed *>> by_cgroup;
	for (const CheckpointNeed &n : needs) {
		total += n.bytes;
		if (n.cgroup)
			by_cgroup[n.cgroup->path].push_back(&n);
	}
	for (const auto &[path, members] : by_cgroup) {
		const CgroupRoom &c = *members.front()->cgroup;
		uint64_t sum = 0;
		for (const CheckpointNeed *n : members)
			sum += n->bytes;
		if (sum > c.room())
			return make_error(ENOMEM,
					  "not enough memory for the checkpoint: the driver copies the GPU memory of pid %s "
					  "into the process, %s in all, but its memory cgroup %s has room for %s only (limit "
					  "%s, in use %s); the kernel would kill the process half way. Raise that memory limit "
					  "(the container's memory limit) by at least %s, or set CUDA_CRIU_MEMORY_CHECK=warn to "
					  "try anyway",
					  pids_of(members).c_str(), human_bytes(sum).c_str(), path.c_str(), human_bytes(c.room()).c_str(),
					  human_bytes(c.limit).c_str(), human_bytes(c.usage).c_str(), human_bytes(sum - c.room()).c_str());
	}
	if (host_available && total > *host_available) {
		std::vector<const CheckpointNeed *> all;
		all.reserve(needs.size());
		for (const CheckpointNeed &n : needs)
			all.push_back(&n);
		return make_error(ENOMEM,
				  "not enough memory for the checkpoint: the driver copies the GPU memory of pid %s into "
				  "the processes, %s in all, but this machine has %s available (MemAvailable); free "
				  "memory (or add swap), or set CUDA_CRIU_MEMORY_CHECK=warn to try anyway",
				  pids_of(all).c_str(), human_bytes(total).c_str(), human_bytes(*host_available).c_str());
	}
	// The figures behind a pass, to compare with what the checkpoint really took.
	std::string rooms;
	for (const auto &[path, members] : by_cgroup)
		rooms += format("; cgroup %s has room for %s", path.c_str(), human_bytes(members.front()->cgroup->room()).c_str());
	LOG_INFO("memory preflight: the checkpoint adds %s to %zu process(es); MemAvailable %s%s", human_bytes(total).c_str(),
		 needs.size(), host_available ? human_bytes(*host_available).c_str() : "unknown", rooms.c_str());
	return {};
}

} // namespace cuda_criu
