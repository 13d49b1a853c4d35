#include "os/memory.h"

#include <sstream>
#include <vector>

#include "base/text.h"
#include "os/proc.h"

namespace cuda_criu {
namespace {

// A byte count as a cgroup file holds it; "max" (v2) and v1's "no limit" (a value near 2^63) are nullopt.
std::optional<uint64_t> read_limit(const std::string &path)
{
	auto text = read_small_file(path);
	if (!text || text->empty() || text->rfind("max", 0) == 0)
		return std::nullopt;
	char *end = nullptr;
	unsigned long long v = strtoull(text->c_str(), &end, 10);
	if (end == text->c_str() || v >= (1ULL << 62))
		return std::nullopt;
	return v;
}

struct Mounts {
	std::string v2;        // mount point of the cgroup2 file system
	std::string v1_memory; // mount point of the v1 hierarchy with the memory controller
};

Mounts cgroup_mounts()
{
	Mounts m;
	for_each_line("/proc/self/mountinfo", [&m](std::istringstream &f) {
		// ... mount-point ... - fstype source super-options
		std::string id, parent, dev, root, point, field;
		f >> id >> parent >> dev >> root >> point;
		while (f >> field && field != "-")
			;
		std::string fstype, source, options;
		f >> fstype >> source >> options;
		if (fstype == "cgroup2" && m.v2.empty())
			m.v2 = point;
		if (fstype == "cgroup" && m.v1_memory.empty() && ("," + options + ",").find(",memory,") != std::string::npos)
			m.v1_memory = point;
	});
	return m;
}

// The cgroup directory of pid and each of its ancestors up to the root of the hierarchy, innermost first.
std::vector<std::string> with_ancestors(const std::string &mount, std::string rel)
{
	std::vector<std::string> dirs;
	while (!rel.empty() && rel != "/") {
		dirs.push_back(mount + rel);
		rel.erase(rel.rfind('/'));
	}
	return dirs;
}

} // namespace

std::optional<uint64_t> host_available_bytes()
{
	auto info = read_small_file("/proc/meminfo");
	if (!info)
		return std::nullopt;
	auto at = info->find("MemAvailable:");
	if (at == std::string::npos)
		return std::nullopt;
	unsigned long long kb = strtoull(info->c_str() + at + 13, nullptr, 10);
	return kb * 1024;
}

std::optional<CgroupRoom> tightest_memory_cgroup(pid_t pid)
{
	auto text = read_small_file("/proc/" + std::to_string(pid) + "/cgroup");
	if (!text)
		return std::nullopt;
	Mounts mounts = cgroup_mounts();
	std::optional<CgroupRoom> best;
	auto consider = [&](const std::string &dir, const char *limit_file, const char *usage_file) {
		auto limit = read_limit(dir + "/" + limit_file);
		if (!limit)
			return;
		CgroupRoom c{dir, *limit, read_limit(dir + "/" + usage_file).value_or(0)};
		if (!best || c.room() < best->room())
			best = c;
	};
	std::istringstream lines(*text);
	std::string line;
	while (std::getline(lines, line)) {
		// hierarchy-id:controllers:path
		size_t a = line.find(':'), b = line.find(':', a + 1);
		if (a == std::string::npos || b == std::string::npos)
			continue;
		std::string controllers = line.substr(a + 1, b - a - 1), rel = line.substr(b + 1);
		if (line.compare(0, a, "0") == 0 && controllers.empty() && !mounts.v2.empty())
			for (const std::string &dir : with_ancestors(mounts.v2, rel))
				consider(dir, "memory.max", "memory.current");
		if (("," + controllers + ",").find(",memory,") != std::string::npos && !mounts.v1_memory.empty())
			for (const std::string &dir : with_ancestors(mounts.v1_memory, rel))
				consider(dir, "memory.limit_in_bytes", "memory.usage_in_bytes");
	}
	return best;
}

} // namespace cuda_criu
