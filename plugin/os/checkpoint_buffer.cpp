#include "os/checkpoint_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <mutex>
#include <thread>
#include <vector>

#include "base/format.h"
#include "os/fs_context.h"
#include "os/process_memory.h"

namespace cuda_criu {
namespace {

constexpr uint64_t kSlice = 64ULL << 20; // what one thread populates at a time

// A source of zeros that costs no memory: reads of untouched anonymous memory map the zero page.
class ZeroSource {
public:
	ZeroSource() : p_(mmap(nullptr, kSlice, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) {}
	~ZeroSource()
	{
		if (p_ != MAP_FAILED)
			munmap(p_, kSlice);
	}
	ZeroSource(const ZeroSource &) = delete;
	ZeroSource &operator=(const ZeroSource &) = delete;
	const void *get() const { return p_ == MAP_FAILED ? nullptr : p_; }

private:
	void *p_;
};

} // namespace

unsigned default_buffer_threads() { return std::clamp(std::thread::hardware_concurrency(), 1U, 16U); }

bool is_checkpoint_buffer(const MmapRequest &r, uint64_t min_bytes)
{
	const uint64_t must = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE;
	const uint64_t must_not = MAP_SHARED | MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_HUGETLB | MAP_GROWSDOWN;
	return r.addr == 0 && (r.flags & must) == must && !(r.flags & must_not) && (r.prot & PROT_WRITE) &&
	       r.len >= min_bytes && r.fd == -1;
}

std::string buffer_pages(const BufferReport &r)
{
	if (!r.huge_pages)
		return "4 KiB pages";
	// The kernel's counters are the machine's: what it gave these buffers is at most their 2 MiB pages.
	const uint64_t pages = std::max<uint64_t>(1, (r.bytes + kHugePage - 1) / kHugePage);
	if (r.fallbacks)
		return format("huge pages for %.0f%% of it (%" PRIu64 " faults fell back to 4 KiB pages, %" PRIu64
			      " compaction stalls: the host's free memory is fragmented)",
			      100.0 * static_cast<double>(std::min(r.huge_faults, pages)) / static_cast<double>(pages),
			      r.fallbacks, r.compact_stalls);
	if (r.compact_stalls)
		return format("huge pages (%" PRIu64 " compaction stalls: the host's free memory is fragmented)",
			      r.compact_stalls);
	return "huge pages";
}

Status populate_process_memory(pid_t pid, uint64_t addr, uint64_t len, unsigned threads)
{
	ZeroSource zeros;
	if (!zeros.get())
		return errno_error("map %llu bytes of zeros", static_cast<unsigned long long>(kSlice));
	threads = std::max(1U, std::min<unsigned>(threads, static_cast<unsigned>((len + kSlice - 1) / kSlice)));
	std::atomic<uint64_t> next{0};
	std::mutex mu;
	Status first;
	auto work = [&] {
		for (;;) {
			uint64_t off = next.fetch_add(kSlice);
			if (off >= len)
				return;
			Status st = write_process_memory(pid, addr + off, zeros.get(), std::min(kSlice, len - off));
			if (!st) {
				next = len; // the others stop too: the driver touches what is left itself
				std::lock_guard<std::mutex> g(mu);
				if (first)
					first = std::move(st);
				return;
			}
		}
	};
	std::vector<std::thread> workers;
	for (unsigned i = 1; i < threads; i++)
		workers.push_back(own_thread(work));
	work();
	for (auto &t : workers)
		t.join();
	return first;
}

} // namespace cuda_criu
