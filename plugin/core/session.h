// The core: one dump or one restore, driving every CUDA process through the driver's state machine
// (running -> locked -> checkpointed -> locked -> running) and putting each back as it was found when
// anything fails. Pure C++: no CRIU header; the ABI layer calls it from the hooks.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/result.h"
#include "core/guard.h"
#include "core/options.h"
#include "core/timed_driver.h"
#include "driver/driver.h"
#include "image/record.h"
#include "os/host.h"

namespace cuda_criu {

// Loads the driver on first need (libcuda is never touched for a dump without CUDA processes).
using DriverSource = std::function<Result<Driver *>()>;
// Starts the guard that outlives CRIU (core/guard.h); empty in tests.
using GuardSource = std::function<Result<DumpGuard>()>;

// Time the plugin spent in one phase (one hook kind), and how much of it the driver's calls covered.
struct PhaseCost {
	uint64_t wall_us = 0;
	uint64_t driver_us = 0;
	uint64_t load_us = 0; // loading libcuda and cuInit, the driver's too
	unsigned processes = 0;
	// "0.21 ms/process" of the plugin's own time.
	std::string per_process() const;
};

class DumpSession {
public:
	DumpSession(Options options, Host &host, DriverSource driver, GuardSource guard = {});

	// PAUSE_DEVICES: locks pid if it is a CUDA process. false: not a CUDA process (nothing done).
	Result<bool> pause(pid_t pid);
	// CHECKPOINT_DEVICES: the first call checkpoints every paused process at once; every call answers
	// for its pid. false: not one of ours.
	Result<bool> checkpoint(pid_t pid);
	// exit(DUMP): when the dump failed or the tasks go on running, returns every process to the state it
	// was found in. Errors name each process that could not be returned.
	Status finish(bool dump_failed, bool leave_running);

	bool has_cuda_processes() const { return !procs_.empty(); }
	ImageRecord image_record() const;
	std::string summary() const;

private:
	struct Proc {
		pid_t pid = 0;
		pid_t ns_pid = 0;
		pid_t restore_tid = 0;
		CudaState initial = CudaState::Running;
		bool locked_by_us = false;
		bool checkpointed_by_us = false;
		std::optional<Error> checkpoint_error;
		std::vector<GpuUuid> gpu_uuids;
		uint64_t rss_before = 0;
		uint64_t state_bytes = 0;
		uint64_t lock_us = 0;
		uint64_t checkpoint_us = 0;
	};

	Status checkpoint_all();
	std::vector<GpuRecord> machine_gpu_records(bool used) const;
	Status load_driver();
	Result<bool> pause_cuda(pid_t pid);

	Options options_;
	Host &host_;
	DriverSource driver_source_;
	GuardSource guard_source_;
	DumpGuard guard_; // its socket closes with the session; the guard then waits for CRIU to exit
	std::unique_ptr<TimedDriver> timed_;
	Driver *driver_ = nullptr; // timed_, once loaded
	PhaseCost pause_cost_, checkpoint_cost_;
	std::vector<Proc> procs_; // in pause order
	bool checkpointed_ = false;
	uint64_t device_phase_us_ = 0;
	uint64_t rollback_us_ = 0;
	std::vector<GpuInfo> machine_gpus_; // the driver's list
	std::vector<GpuInfo> kernel_gpus_;  // Host::machine_gpus()
};

class RestoreSession {
public:
	// image: our image, or nullopt for an image of CRIU's own plugin. criu_fails_on_error: CRIU turns a
	// RESUME_DEVICES_LATE failure into a failed restore (our patch); without it, the session kills
	// the restored tasks itself so that no process runs without its GPU state.
	// guard: told about each process before its restore and after its unlock (inactive in tests).
	RestoreSession(Options options, Host &host, DriverSource driver, std::optional<ImageRecord> image,
		       bool criu_fails_on_error, RestoreGuard guard = {});

	// RESUME_DEVICES_LATE: the first call restores and unlocks every restored CUDA process at once.
	// false: pid is not a CUDA process.
	Result<bool> resume(pid_t pid);
	std::string summary() const;
	bool any_failed() const;

private:
	struct Outcome {
		std::optional<Error> error;
		pid_t ns_pid = 0;
		uint64_t restore_us = 0;
	};

	void restore_batch(const std::vector<pid_t> &candidates);
	Result<std::vector<GpuPair>> gpu_pairs(Driver &driver);

	Options options_;
	Host &host_;
	DriverSource driver_source_;
	std::optional<ImageRecord> image_;
	bool criu_fails_on_error_;
	RestoreGuard guard_; // its socket closes with the session: a process not restored by then is killed
	std::unique_ptr<TimedDriver> timed_;
	PhaseCost restore_cost_;
	std::map<pid_t, Outcome> outcomes_; // CUDA processes handled so far
	std::map<pid_t, bool> seen_;        // every pid looked at: true when it is a CUDA process
	bool killed_ = false;
	std::set<pid_t> missing_reported_;
	uint64_t device_phase_us_ = 0;
};

} // namespace cuda_criu
