// Compressed GPU state the driver's restore reads while it is still being decoded (criu-patches/0010).
// CRIU maps each process's decoded chunks from memory the plugin fills (core/mapped_restore.h) and, where
// the plugin asked, registers them with a userfaultfd for missing and minor faults: each first touch of a
// page then waits until its chunk is decoded (and is mapped from that memory at once), and a chunk that is
// waited for is decoded next. So the driver's restore starts when CRIU is done instead of when the whole
// image is: it reads its memory in ascending order, about as fast as the disk delivers it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "base/memory_range.h"
#include "base/result.h"
#include "os/unique_fd.h"
#include "os/userfault.h"

namespace cuda_criu {

class LazyDecoded {
public:
	LazyDecoded() = default;
	LazyDecoded(const LazyDecoded &) = delete;
	LazyDecoded &operator=(const LazyDecoded &) = delete;
	// finish()
	~LazyDecoded();

	// Before the decode starts: the chunks of a process (its pid in the image) whose decoded state CRIU
	// registers, as address ranges in the process, ascending and page aligned.
	void add(pid_t ns_pid, std::vector<MemoryRange> chunks);
	bool has(pid_t ns_pid) const;

	// The decode: ns_pid's chunk at addr is decoded into the memory the process maps (mapped into the
	// process now where it is attached).
	void decoded(pid_t ns_pid, uint64_t addr);
	// The decode: the next chunk a process waits for, if any.
	std::optional<std::pair<pid_t, uint64_t>> wanted();
	// The decode is over, whatever its outcome: every registration ends, so that nothing waits any more
	// (a page then shows whatever the memory holds; a failed decode fails the restore before any process
	// runs). Its error: a fault could not be served. Once only; later calls return the same.
	Status finish();

	// At the first RESUME_DEVICES_LATE, for every process added: userfaultfd(ns_pid) gives the descriptor
	// CRIU registered its chunks with (or -errno: none, its memory is mapped as usual). Serves their faults
	// on a thread of its own until finish(). Returns the processes whose driver's restore may read before
	// the decode is over (none once it is over: their registrations end now).
	std::set<pid_t> attach(const std::function<int(pid_t ns_pid)> &userfaultfd);

private:
	enum : uint8_t { kPending = 0, kDecoded = 1, kMapped = 2, kWanted = 4 };
	struct Process {
		pid_t ns_pid = 0;
		std::vector<MemoryRange> chunks;
		std::vector<uint8_t> state;
		std::unique_ptr<Userfault> uffd; // once attached
		std::vector<size_t> to_sweep;    // chunks decoded before the attach, mapped by the server
		size_t sweep = 0;                // those of them it has mapped
		unsigned faults = 0, waited = 0;
		bool unregistered = false;
	};
	Process *find(pid_t ns_pid);
	static std::optional<size_t> chunk_at(const Process &p, uint64_t addr);
	void serve();
	bool sweep_some();
	void fault(Process &p, uint64_t addr);
	void map_chunk(Process &p, size_t i);
	void fail(const Error &e);
	void end_registrations();

	std::vector<Process> processes_; // fixed once the decode starts
	mutable std::mutex mu_;
	std::deque<std::pair<pid_t, uint64_t>> wanted_;
	std::optional<Error> error_;
	bool finished_ = false;
	bool serving_ = false;
	bool ended_ = false; // registrations ended (an attach after it ends its own at once)
	UniqueFd stop_;      // eventfd: the server stops
	std::thread server_;
};

} // namespace cuda_criu
