// Progress of a long phase (the checkpoint or the restore of several processes): what the driver has
// copied so far, a line for the log every few seconds, and whether a process has stopped making progress
// (a stall, told apart from a slow copy). Pure bookkeeping: the caller samples the processes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cuda_criu {

// One look at a process during the phase.
struct ProgressSample {
	uint64_t bytes = 0;     // copied so far (checkpoint: growth of its memory; restore: its GPU memory)
	uint64_t cpu_ticks = 0; // CPU time of its restore thread: a copy that shows no bytes yet still burns it
};

class Progress {
public:
	struct Proc {
		pid_t pid = 0;
		uint64_t expected = 0; // bytes the phase will copy; 0 = unknown
	};
	// stall_needs_bytes: a process counts as stalled only once its bytes have moved at least once (for a
	// phase whose byte count may stay 0 until the end, the restore's GPU memory as NVML reports it).
	Progress(std::string phase, std::vector<Proc> procs, uint64_t stall_us, uint64_t every_us, uint64_t start_us,
		 bool stall_needs_bytes = false);

	// Records a sample of process i at now_us; finished: its driver call has returned.
	void observe(size_t i, const ProgressSample &s, bool finished, uint64_t now_us);
	// Process i has not begun its copy yet (its lock still waits for the GPU's work): no stall until it
	// has.
	void waiting(size_t i, uint64_t now_us) { state_[i].moved_us = now_us; }
	// The log line due now, if any (the first after a second, then one every every_us), e.g.
	// "checkpoint: 12.3 of 40.0 GiB (1.6 GB/s), 3 of 4 processes done".
	std::optional<std::string> line(uint64_t now_us);
	// A process whose bytes and CPU time have not moved for the stall time (never one that finished).
	std::optional<size_t> stalled(uint64_t now_us) const;
	// "the driver's checkpoint made no progress for 30 s (...), stopped at 3.2 of 16.0 GiB"
	std::string stall_message(size_t i, uint64_t now_us) const;
	pid_t pid(size_t i) const { return procs_[i].pid; }

private:
	struct State {
		ProgressSample last;
		uint64_t moved_us = 0; // when its sample last changed
		bool finished = false;
	};
	uint64_t total_done() const;

	std::string phase_;
	std::vector<Proc> procs_;
	std::vector<State> state_;
	uint64_t stall_us_, every_us_;
	bool stall_needs_bytes_;
	uint64_t last_line_us_, last_line_bytes_ = 0;
	unsigned lines_ = 0;
};

} // namespace cuda_criu
