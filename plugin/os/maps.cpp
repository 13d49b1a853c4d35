#include "os/maps.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "base/text.h"

namespace cuda_criu {

bool Mapping::private_anon() const
{
	return perms.size() == 4 && perms[3] == 'p' && inode == 0 && (path.empty() || path.rfind("[anon:", 0) == 0);
}

std::vector<Mapping> parse_maps(std::string_view text)
{
	std::vector<Mapping> out;
	std::istringstream in{std::string(text)};
	std::string line;
	while (std::getline(in, line)) {
		// start-end perms offset dev inode [path]
		Mapping m;
		char perms[8] = {}, dev[32] = {};
		unsigned long long start = 0, end = 0, off = 0, inode = 0;
		int path_at = 0;
		if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %31s %llu %n", &start, &end, perms, &off, dev, &inode,
				&path_at) < 6)
			continue;
		m.start = start;
		m.end = end;
		m.perms = perms;
		m.offset = off;
		m.dev = dev;
		m.inode = inode;
		if (path_at > 0 && static_cast<size_t>(path_at) < line.size())
			m.path = line.substr(static_cast<size_t>(path_at));
		out.push_back(std::move(m));
	}
	return out;
}

Result<std::vector<Mapping>> read_maps(pid_t pid)
{
	std::string path = "/proc/" + std::to_string(pid) + "/maps";
	auto text = read_small_file(path, 64 << 20); // a large process has tens of thousands of mappings
	if (!text)
		return std::move(text).error();
	return parse_maps(*text);
}

namespace {

// [start, end) minus the sorted, disjoint `cover`.
void subtract(uint64_t start, uint64_t end, const std::vector<MemoryRange> &cover, std::vector<MemoryRange> &out)
{
	for (const MemoryRange &c : cover) {
		if (c.end <= start)
			continue;
		if (c.start >= end)
			break;
		if (c.start > start)
			out.push_back({start, c.start});
		start = std::max(start, c.end);
		if (start >= end)
			return;
	}
	if (start < end)
		out.push_back({start, end});
}

std::vector<MemoryRange> ranges_of(const std::vector<Mapping> &maps)
{
	std::vector<MemoryRange> r;
	r.reserve(maps.size());
	for (const Mapping &m : maps)
		r.push_back({m.start, m.end});
	std::sort(r.begin(), r.end(), [](const MemoryRange &a, const MemoryRange &b) { return a.start < b.start; });
	return r;
}

} // namespace

std::vector<MemoryRange> added_private_anon(const std::vector<Mapping> &before, const std::vector<Mapping> &after)
{
	std::vector<MemoryRange> old = ranges_of(before);
	std::vector<MemoryRange> added, reserved; // readable / inaccessible private anonymous memory that appeared
	for (const Mapping &m : after) {
		if (!m.private_anon())
			continue;
		if (m.perms[0] == 'r')
			subtract(m.start, m.end, old, added);
		else if (m.perms.compare(0, 3, "---") == 0)
			subtract(m.start, m.end, old, reserved);
	}
	std::vector<MemoryRange> out;
	for (const MemoryRange &a : added) {
		bool next_to_reserved = std::any_of(reserved.begin(), reserved.end(), [&](const MemoryRange &r) {
			return r.end == a.start || r.start == a.end;
		});
		if (next_to_reserved)
			continue;
		if (!out.empty() && out.back().end == a.start)
			out.back().end = a.end;
		else
			out.push_back(a);
	}
	return out;
}

uint64_t total_bytes(const std::vector<MemoryRange> &ranges)
{
	uint64_t n = 0;
	for (const MemoryRange &r : ranges)
		n += r.end - r.start;
	return n;
}

std::vector<Mapping> pages_image_mappings(const std::vector<Mapping> &maps, const std::string &dir)
{
	std::vector<Mapping> out;
	for (const Mapping &m : maps)
		for (const char *kind : {"/pages-", "/cuda-gpu-"}) {
			std::string prefix = dir + kind;
			if (m.path.compare(0, prefix.size(), prefix) != 0)
				continue;
			// "pages-3.img", or "pages-3.img (deleted)" once the image is gone
			std::string_view rest = std::string_view(m.path).substr(prefix.size());
			size_t digits = rest.find_first_not_of("0123456789");
			if (digits == 0 || digits == std::string_view::npos)
				continue;
			rest.remove_prefix(digits);
			if (rest == ".img" || rest == ".img (deleted)")
				out.push_back(m);
		}
	return out;
}

std::vector<IpcFileMapping> cuda_ipc_files(const std::vector<Mapping> &maps)
{
	constexpr std::string_view kPrefix = "/dev/shm/cuda.shm.", kDeleted = " (deleted)";
	std::vector<IpcFileMapping> out;
	for (const Mapping &m : maps) {
		std::string_view path = m.path;
		if (path.compare(0, kPrefix.size(), kPrefix) != 0 || m.inode == 0)
			continue;
		if (path.size() > kDeleted.size() && path.substr(path.size() - kDeleted.size()) == kDeleted)
			path.remove_suffix(kDeleted.size());
		// "<n>.<pid in hex>.<n>"
		std::string_view name = path.substr(kPrefix.size());
		constexpr size_t kNpos = std::string_view::npos;
		size_t dot1 = name.find('.'), dot2 = dot1 == kNpos ? kNpos : name.find('.', dot1 + 1);
		if (dot2 == kNpos || name.find('.', dot2 + 1) != kNpos)
			continue;
		std::string hex(name.substr(dot1 + 1, dot2 - dot1 - 1));
		if (hex.empty() || hex.size() > 8 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
			continue;
		bool seen = std::any_of(out.begin(), out.end(), [&](const IpcFileMapping &f) {
			return f.inode == m.inode && f.dev == m.dev;
		});
		if (!seen)
			out.push_back({std::string(path), m.dev, m.inode,
				       static_cast<pid_t>(std::stoul(hex, nullptr, 16))});
	}
	return out;
}

} // namespace cuda_criu
