#include "core/progress.h"

#include <algorithm>

#include "base/format.h"

namespace cuda_criu {
namespace {

// Bytes in the unit that suits scale (GiB from 1 GiB up, else MiB), without the unit's name.
std::string in_unit(uint64_t b, uint64_t scale)
{
	if (scale >= (1ULL << 30))
		return format("%.1f", static_cast<double>(b) / (1ULL << 30));
	return format("%.0f", static_cast<double>(b) / (1ULL << 20));
}
const char *unit(uint64_t scale) { return scale >= (1ULL << 30) ? "GiB" : "MiB"; }

} // namespace

Progress::Progress(std::string phase, std::vector<Proc> procs, uint64_t stall_us, uint64_t every_us, uint64_t start_us,
		   bool stall_needs_bytes)
	: phase_(std::move(phase)), procs_(std::move(procs)), state_(procs_.size()), stall_us_(stall_us),
	  every_us_(every_us), stall_needs_bytes_(stall_needs_bytes), last_line_us_(start_us)
{
	for (State &s : state_)
		s.moved_us = start_us;
}

void Progress::observe(size_t i, const ProgressSample &s, bool finished, uint64_t now_us)
{
	State &st = state_[i];
	if (s.bytes != st.last.bytes || s.cpu_ticks != st.last.cpu_ticks)
		st.moved_us = now_us;
	st.last = s;
	st.finished = st.finished || finished;
}

uint64_t Progress::total_done() const
{
	uint64_t done = 0;
	for (size_t i = 0; i < procs_.size(); i++) {
		uint64_t b = state_[i].last.bytes;
		// A finished process has copied all it had to, whatever the sample says.
		done += state_[i].finished && procs_[i].expected ? procs_[i].expected : b;
	}
	return done;
}

std::optional<std::string> Progress::line(uint64_t now_us)
{
	// The first line after a second (a phase that takes two shows one), then one every every_us.
	uint64_t wait = lines_ ? every_us_ : std::min<uint64_t>(every_us_, 1000000);
	if (now_us < last_line_us_ + wait)
		return std::nullopt;
	lines_++;
	uint64_t done = total_done(), expected = 0;
	size_t finished = 0;
	for (size_t i = 0; i < procs_.size(); i++) {
		expected += procs_[i].expected;
		finished += state_[i].finished ? 1 : 0;
	}
	double secs = static_cast<double>(now_us - last_line_us_) / 1e6;
	double rate = done > last_line_bytes_ ? static_cast<double>(done - last_line_bytes_) / secs : 0.0; // B/s
	std::string speed = rate >= 1e9 ? format("%.1f GB/s", rate / 1e9) : format("%.0f MB/s", rate / 1e6);
	last_line_us_ = now_us;
	last_line_bytes_ = done;
	uint64_t scale = std::max(expected, done);
	std::string of = expected ? " of " + in_unit(expected, scale) : "";
	return format("%s: %s%s %s (%s), %zu of %zu process(es) done", phase_.c_str(), in_unit(done, scale).c_str(),
		      of.c_str(), unit(scale), speed.c_str(), finished, procs_.size());
}

std::optional<size_t> Progress::stalled(uint64_t now_us) const
{
	if (!stall_us_)
		return std::nullopt;
	for (size_t i = 0; i < procs_.size(); i++)
		if (!state_[i].finished && now_us >= state_[i].moved_us + stall_us_ &&
		    !(stall_needs_bytes_ && state_[i].last.bytes == 0))
			return i;
	return std::nullopt;
}

std::string Progress::stall_message(size_t i, uint64_t now_us) const
{
	uint64_t scale = std::max(procs_[i].expected, state_[i].last.bytes);
	std::string of = procs_[i].expected ? " of " + in_unit(procs_[i].expected, scale) : "";
	return format("the driver's %s made no progress for %.0f s (the restore thread used no CPU time and no more "
		      "bytes were copied), stopped at %s%s %s",
		      phase_.c_str(), static_cast<double>(now_us - state_[i].moved_us) / 1e6,
		      in_unit(state_[i].last.bytes, scale).c_str(), of.c_str(), unit(scale));
}

} // namespace cuda_criu
