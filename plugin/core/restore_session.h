// The restore: finds the restored CUDA processes among CRIU's stopped tasks, restores each one's GPU
// state (checkpointed -> locked -> running) and makes sure none runs without it.
// Pure C++: no CRIU header; the ABI layer calls it from the hooks.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "core/driver_calls.h"
#include "core/gpu_store.h"
#include "core/dump_session.h"
#include "core/guard.h"
#include "core/options.h"
#include "driver/driver.h"
#include "image/record.h"
#include "os/host.h"

namespace cuda_criu {

// Puts the GPU state the plugin stored itself (core/gpu_store.h) back into the restored processes, each
// chunk checked (run); empty when CRIU's pages images hold it unchecked. writes(ns_pid): whether run
// writes into that process; where it writes into none, it only reads (chunks CRIU mapped, or CRIU's
// pages), and, when the image is not in the page cache, runs alongside the driver's restore, which then
// reads the disk once for both: no process is unlocked before it has passed.
struct GpuImageLoad {
	std::function<Status(const std::vector<GpuLoadTarget> &targets)> run;
	std::function<bool(pid_t ns_pid)> writes;
	// Whether the image is in the page cache: its check then reads at memory speed and runs first, alone
	// (run alongside, it slowed the driver's warm restore more than it took: H200, 4 GiB, 1.05 -> 1.21 s).
	// Empty: not known, the check runs alongside.
	std::function<bool()> cached;

	explicit operator bool() const { return static_cast<bool>(run); }
	Status operator()(const std::vector<GpuLoadTarget> &targets) const { return run(targets); }
};

class RestoreSession {
public:
	// image: our image, or nullopt for an image of CRIU's own plugin. criu_fails_on_error: CRIU turns a
	// RESUME_DEVICES_LATE failure into a failed restore (our patch); without it, the session kills
	// the restored tasks itself so that no process runs without its GPU state.
	// guard: told about each process before its restore and after its unlock (inactive in tests).
	RestoreSession(Options options, Host &host, DriverSource driver, std::optional<ImageRecord> image,
		       bool criu_fails_on_error, RestoreGuard guard = {}, GpuImageLoad load_gpu = {});

	// RESUME_DEVICES_LATE: the first call restores and unlocks every restored CUDA process at once.
	// false: pid is not a CUDA process. An error returned has been logged, naming the process, where the
	// session decided it: the caller only refers to it.
	Result<bool> resume(pid_t pid);
	// A failure of the RESUME_DEVICES_LATE hook for pid outside resume() (the driver's load timed out, an
	// internal error): recorded for pid (the summary counts it) and, on a CRIU that ignores a hook's
	// failure, every restored task is killed, as for a failure inside. Logged by the caller.
	void abandon(pid_t pid, const Error &e);
	std::string summary() const;
	bool any_failed() const;

private:
	struct Outcome {
		std::optional<Error> error;
		pid_t ns_pid = 0;
		uint64_t restore_us = 0;
	};

	void restore_batch(const std::vector<pid_t> &candidates);
	std::shared_future<Status> check_alongside(const std::vector<GpuLoadTarget> &targets);
	std::vector<ProcJob> find_cuda_processes(const std::vector<pid_t> &candidates);
	Status load_driver(pid_t pid);
	void restore_all(std::vector<ProcJob> jobs);
	PhaseProgress restore_progress(const std::vector<pid_t> &pids);
	void report_missing();
	Result<std::vector<GpuPair>> gpu_pairs();
	void failed(const std::vector<pid_t> &pids, const Error &e, bool shared = false);
	void kill_if_criu_ignores_failure(const std::vector<pid_t> &candidates);

	Options options_;
	Host &host_;
	DriverSource driver_source_;
	std::optional<ImageRecord> image_;
	bool criu_fails_on_error_;
	RestoreGuard guard_; // its socket closes with the session: a process not restored by then is killed
	SharedDriver driver_; // shared with abandoned calls; null until loaded
	PhaseCost restore_cost_;
	std::map<pid_t, Outcome> outcomes_; // CUDA processes handled so far
	std::map<pid_t, bool> seen_;        // every pid looked at: true when it is a CUDA process
	bool killed_ = false;
	std::set<pid_t> missing_reported_;
	uint64_t device_phase_us_ = 0;
	GpuImageLoad load_gpu_;
	uint64_t load_gpu_us_ = 0;
	bool checked_alongside_ = false;
	std::shared_ptr<std::atomic<uint64_t>> check_us_; // the check's time, written on its own thread
};

} // namespace cuda_criu
