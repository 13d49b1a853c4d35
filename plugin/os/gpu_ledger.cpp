#include "os/gpu_ledger.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/log.h"
#include "base/text.h"
#include "os/proc.h"
#include "os/unique_fd.h"

namespace cuda_criu {

namespace {

std::string format_ledger(const std::vector<std::pair<GpuReservation, uint64_t>> &entries)
{
	std::string out;
	for (const auto &[r, started] : entries)
		out += std::to_string(r.owner) + " " + std::to_string(started) + " " + r.gpu + " " + std::to_string(r.bytes) +
		       "\n";
	return out;
}

// Opens and locks the ledger; -1 when it cannot be used (why logged at debug level).
UniqueFd lock_ledger(const std::string &path)
{
	std::string dir = path.substr(0, path.rfind('/'));
	if (!dir.empty() && mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
		LOG_DEBUG("no GPU reservation ledger (%s: %s)", dir.c_str(), std::strerror(errno));
		return UniqueFd();
	}
	UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
	if (!fd.valid()) {
		LOG_DEBUG("no GPU reservation ledger (%s: %s)", path.c_str(), std::strerror(errno));
		return fd;
	}
	while (flock(fd.get(), LOCK_EX) != 0)
		if (errno != EINTR) {
			LOG_DEBUG("no GPU reservation ledger (flock %s: %s)", path.c_str(), std::strerror(errno));
			return UniqueFd();
		}
	return fd;
}

// The live entries of other processes in the locked ledger fd.
std::vector<std::pair<GpuReservation, uint64_t>> live_others(int fd)
{
	std::string text;
	char buf[4096];
	ssize_t n;
	off_t at = 0;
	while ((n = pread(fd, buf, sizeof(buf), at)) > 0) {
		text.append(buf, static_cast<size_t>(n));
		at += n;
	}
	std::vector<std::pair<GpuReservation, uint64_t>> out;
	for (auto &entry : parse_ledger(text))
		if (entry.first.owner != getpid() && start_time_of(entry.first.owner) == entry.second)
			out.push_back(std::move(entry));
	return out;
}

void rewrite(int fd, const std::vector<std::pair<GpuReservation, uint64_t>> &entries)
{
	std::string text = format_ledger(entries);
	if (ftruncate(fd, 0) != 0 || pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
		LOG_WARN("cannot update the GPU reservation ledger: %s", std::strerror(errno));
}

} // namespace

std::vector<std::pair<GpuReservation, uint64_t>> parse_ledger(const std::string &text)
{
	std::vector<std::pair<GpuReservation, uint64_t>> out;
	std::istringstream in(text);
	std::string line;
	while (std::getline(in, line)) {
		std::istringstream fields(line);
		GpuReservation r;
		uint64_t started = 0;
		if (fields >> r.owner >> started >> r.gpu >> r.bytes && r.owner > 0)
			out.emplace_back(std::move(r), started);
	}
	return out;
}

Status reserve_in_ledger(const std::string &path, const ReserveDecision &decide)
{
	UniqueFd fd = lock_ledger(path);
	if (!fd.valid()) {
		if (auto mine = decide({}); !mine)
			return std::move(mine).error();
		return {};
	}
	auto entries = live_others(fd.get());
	std::vector<GpuReservation> others;
	others.reserve(entries.size());
	for (const auto &e : entries)
		others.push_back(e.first);
	auto mine = decide(others);
	if (mine) {
		uint64_t started = start_time_of(getpid());
		for (GpuReservation &r : *mine) {
			r.owner = getpid();
			entries.emplace_back(std::move(r), started);
		}
	}
	rewrite(fd.get(), entries);
	if (!mine)
		return std::move(mine).error();
	return {};
}

void release_in_ledger(const std::string &path)
{
	UniqueFd fd = lock_ledger(path);
	if (fd.valid())
		rewrite(fd.get(), live_others(fd.get()));
}

} // namespace cuda_criu
