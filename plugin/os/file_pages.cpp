#include "os/file_pages.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <cinttypes>

#include "base/format.h"
#include "base/text.h"

namespace cuda_criu {

namespace {

constexpr uint64_t kPresent = 1ULL << 63;
constexpr uint64_t kFilePage = 1ULL << 61; // a file's page (or shared anonymous memory), not a private copy
constexpr size_t kEntriesPerRead = 65536;  // 512 KiB of /proc/PID/pagemap at a time
constexpr uint64_t kGap = 32; // pages: runs a read-around window apart (128 KiB at the least) cost about one request together

std::string map_files_entry(pid_t pid, const Mapping &m)
{
	return format("/proc/%d/map_files/%" PRIx64 "-%" PRIx64, pid, m.start, m.end);
}

// Type and mount of the file at path (or of fd where path is ""), from what the kernel has cached: no
// request to a FUSE daemon or a network server.
bool statx_cached(int fd, const char *path, struct statx &sx)
{
	return statx(fd, path, (*path ? 0 : AT_EMPTY_PATH) | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_SIZE | STATX_MNT_ID,
		     &sx) == 0 &&
	       (sx.stx_mask & STATX_MNT_ID);
}

// A mapping of a regular file on a local mount (map_files: the very file, whatever its path).
bool maps_local_regular_file(pid_t pid, const Mapping &m, const LocalMounts &local)
{
	struct statx sx {};
	return m.inode != 0 && statx_cached(AT_FDCWD, map_files_entry(pid, m).c_str(), sx) && S_ISREG(sx.stx_mode) &&
	       local.has(sx.stx_mnt_id);
}

} // namespace

std::vector<MemoryRange> file_page_runs(const uint64_t *entries, size_t n, uint64_t start, uint64_t page_size)
{
	std::vector<MemoryRange> runs;
	for (size_t i = 0; i < n; i++) {
		if ((entries[i] & (kPresent | kFilePage)) != (kPresent | kFilePage))
			continue;
		uint64_t at = start + i * page_size;
		if (!runs.empty() && runs.back().end == at)
			runs.back().end += page_size;
		else
			runs.push_back({at, at + page_size});
	}
	return runs;
}

std::vector<MemoryRange> coalesce_ranges(std::vector<MemoryRange> ranges, uint64_t gap, size_t max_ranges)
{
	for (;;) {
		std::vector<MemoryRange> out;
		for (const MemoryRange &r : ranges)
			if (!out.empty() && r.start <= out.back().end + gap)
				out.back().end = std::max(out.back().end, r.end);
			else
				out.push_back(r);
		if (out.size() <= max_ranges || out.size() <= 1)
			return out;
		ranges = std::move(out);
		gap = gap ? gap * 2 : 4096;
	}
}

Result<std::vector<MemoryRange>> mapped_file_pages(pid_t pid, const std::vector<Mapping> &maps, size_t max_ranges)
{
	UniqueFd pagemap(open(format("/proc/%d/pagemap", pid).c_str(), O_RDONLY | O_CLOEXEC));
	if (!pagemap.valid())
		return make_error(errno, "/proc/%d/pagemap: %s", pid, errno_string(errno).c_str());
	const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
	std::vector<uint64_t> entries(kEntriesPerRead);
	std::vector<MemoryRange> pages;
	LocalMounts local(pid);
	for (const Mapping &m : maps) {
		if (!maps_local_regular_file(pid, m, local))
			continue;
		for (uint64_t at = m.start; at < m.end;) {
			size_t n = std::min<uint64_t>(kEntriesPerRead, (m.end - at) / page);
			ssize_t got = pread(pagemap.get(), entries.data(), n * sizeof(uint64_t),
					    static_cast<off_t>(at / page * sizeof(uint64_t)));
			if (got <= 0)
				break; // the mapping went away, or pagemap ends: what was read stands
			size_t read = static_cast<size_t>(got) / sizeof(uint64_t);
			std::vector<MemoryRange> runs = file_page_runs(entries.data(), read, at, page);
			pages.insert(pages.end(), runs.begin(), runs.end());
			at += read * page;
			if (pages.size() > 2 * max_ranges + kEntriesPerRead) // bounded while it grows
				pages = coalesce_ranges(std::move(pages), kGap * page, max_ranges);
		}
	}
	return coalesce_ranges(std::move(pages), kGap * page, max_ranges);
}

bool is_driver_library(const std::string &path)
{
	std::string_view name = path;
	name.remove_prefix(name.rfind('/') == std::string_view::npos ? 0 : name.rfind('/') + 1);
	return name.rfind("libcuda.so", 0) == 0 || name.rfind("libnvidia-", 0) == 0;
}

uint64_t read_file_pages_ahead(pid_t pid, const std::vector<MemoryRange> &ranges, uint64_t max_bytes,
			       const std::atomic<bool> &stop)
{
	auto maps = read_maps(pid);
	if (!maps)
		return 0;
	uint64_t asked = 0;
	LocalMounts local(pid);
	// The driver's libraries first: its restore thread runs their code while this reads ahead, and each of
	// its faults would otherwise wait behind the read-ahead of every other library.
	for (bool driver : {true, false}) {
		size_t r = 0;
		for (const Mapping &m : *maps) {
			while (r < ranges.size() && ranges[r].end <= m.start)
				r++;
			if (r == ranges.size())
				break;
			if (ranges[r].start >= m.end || m.inode == 0 || is_driver_library(m.path) != driver)
				continue;
			UniqueFd fd = open_regular_file(map_files_entry(pid, m).c_str(), local);
			if (!fd.valid())
				continue;
			for (size_t i = r; i < ranges.size() && ranges[i].start < m.end; i++) {
				uint64_t from = std::max(ranges[i].start, m.start), to = std::min(ranges[i].end, m.end);
				uint64_t len = std::min(to - from, max_bytes - asked);
				asked += ask_to_read_ahead(fd.get(), m.offset + (from - m.start), len, &stop);
				if (asked >= max_bytes || stop.load(std::memory_order_relaxed))
					return asked;
			}
		}
	}
	return asked;
}

LocalMounts::LocalMounts(pid_t pid)
{
	static const std::set<std::string> kLocal = {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "overlay",
						      "squashfs", "erofs"};
	auto text = read_small_file(pid ? format("/proc/%d/mountinfo", pid) : "/proc/self/mountinfo", 16 << 20);
	if (!text)
		return;
	std::istringstream in(*text);
	std::string line;
	while (std::getline(in, line)) {
		// ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER-OPTIONS
		size_t dash = line.find(" - ");
		unsigned long long id = 0;
		if (dash == std::string::npos || std::sscanf(line.c_str(), "%llu", &id) != 1)
			continue;
		std::string type = line.substr(dash + 3, line.find(' ', dash + 3) - (dash + 3));
		if (kLocal.count(type))
			ids_.push_back(id);
	}
	std::sort(ids_.begin(), ids_.end());
}

bool LocalMounts::has(uint64_t mnt_id) const { return std::binary_search(ids_.begin(), ids_.end(), mnt_id); }

UniqueFd open_regular_file(const char *path, const LocalMounts &local, uint64_t *size)
{
	UniqueFd at(open(path, O_PATH | O_CLOEXEC));
	struct statx sx {};
	if (!at.valid() || !statx_cached(at.get(), "", sx) || !S_ISREG(sx.stx_mode) || !local.has(sx.stx_mnt_id))
		return UniqueFd();
	if (size)
		*size = sx.stx_size;
	return UniqueFd(open(format("/proc/self/fd/%d", at.get()).c_str(), O_RDONLY | O_CLOEXEC));
}

uint64_t ask_to_read_ahead(int fd, uint64_t offset, uint64_t len, const std::atomic<bool> *stop)
{
	constexpr uint64_t kWindow = 128 << 10;
	uint64_t at = offset;
	for (; at < offset + len && !(stop && stop->load(std::memory_order_relaxed)); at += kWindow)
		(void)posix_fadvise(fd, static_cast<off_t>(at), static_cast<off_t>(std::min(kWindow, offset + len - at)),
				    POSIX_FADV_WILLNEED);
	return std::min(at, offset + len) - offset;
}

uint64_t read_into_cache(int fd, uint64_t offset, uint64_t len, std::vector<uint8_t> &buf,
			 const std::atomic<bool> *stop)
{
	uint64_t done = 0;
	while (done < len && !buf.empty() && !(stop && stop->load(std::memory_order_relaxed))) {
		size_t want = std::min<uint64_t>(buf.size(), len - done);
		ssize_t n = pread(fd, buf.data(), want, static_cast<off_t>(offset + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		done += static_cast<uint64_t>(n);
	}
	return done;
}

} // namespace cuda_criu
