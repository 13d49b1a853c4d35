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
#include <thread>
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
// chunk checked; empty when CRIU's pages images hold it unchecked.
// - handled_before_restore(ns_pid): whether run handles that process before the driver's restore: it writes the process's
//   chunks into it, or reads back and checks what CRIU restored from its pages images (checksums only).
// - check_mapped: checks the chunks of every other process, which CRIU maps from the plugin's files (and
//   reads those of processes with compressed chunks ahead of their write, so that a cold image is read
//   while CRIU restores memory; their write checks them again). It
//   reads only those files, so it starts as soon as CRIU has forked the tasks (POST_FORKING) and runs on
//   threads of its own while CRIU restores memory and, if it is not done by then, while the driver
//   restores; no process is unlocked before it has passed. Empty when CRIU maps nothing.
// - decoded(ns_pid): whether CRIU maps that process's compressed chunks from memory check_mapped decodes
//   them into: its driver's restore waits for the check.
// - release_decoded(ns_pid, pid): once the driver restored pid and its check passed, gives that memory back
//   (where pid no longer maps it).
// - attach_lazy(): at the first RESUME_DEVICES_LATE, the processes whose decoded memory comes in on demand
//   (core/lazy_decoded.h): their driver's restore starts at once instead of waiting for the check.
struct GpuImageLoad {
	std::function<Status(const std::vector<GpuLoadTarget> &targets)> run;
	std::function<bool(pid_t ns_pid)> handled_before_restore;
	std::function<Status(const std::atomic<bool> &cancel)> check_mapped;
	std::function<bool(pid_t ns_pid)> decoded;
	std::function<void(pid_t ns_pid, pid_t pid)> release_decoded;
	std::function<std::set<pid_t>()> attach_lazy;

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
	// Cancels the check of the mapped GPU image if it still runs (a restore that failed before its
	// processes were found) and waits for its threads: they read the image directory CRIU closes.
	~RestoreSession();
	RestoreSession(const RestoreSession &) = delete;
	RestoreSession &operator=(const RestoreSession &) = delete;

	// POST_FORKING: starts GpuImageLoad::check_mapped on a thread that first runs own_fs (core/background.h).
	// Without that hook (or in tests) it starts at the first RESUME_DEVICES_LATE. Once only.
	void start_check(std::function<void()> own_fs);

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
	std::vector<ProcJob> find_cuda_processes(const std::vector<pid_t> &candidates);
	Status load_driver(pid_t pid);
	void restore_all(std::vector<ProcJob> jobs);
	std::thread read_file_pages_ahead(const std::vector<ProcJob> &jobs, const std::shared_future<Status> &checked,
					  const std::shared_ptr<std::atomic<bool>> &stop);
	PhaseProgress restore_progress(const std::vector<pid_t> &pids);
	void report_missing();
	Result<std::vector<GpuPair>> gpu_pairs();
	Result<std::vector<GpuInfo>> gpus_with_free_memory();
	std::vector<GpuReservation> not_yet_allocated(std::vector<GpuReservation> others);
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
	// This batch's GPU memory in the machine's ledger (null: none held); shared with its driver calls.
	std::shared_ptr<GpuReservations> reservations_;
	std::map<pid_t, pid_t> reservation_keys_; // image pid -> the process its ledger entries name
	GpuImageLoad load_gpu_;
	uint64_t load_gpu_us_ = 0; // run's time, before the driver's restore
	// check_mapped's result, its time (written on its own thread) and its cancel flag; invalid until started.
	std::shared_future<Status> mapped_checked_;
	std::shared_ptr<std::atomic<uint64_t>> mapped_check_us_ = std::make_shared<std::atomic<uint64_t>>(0);
	std::shared_ptr<std::atomic<bool>> cancel_check_ = std::make_shared<std::atomic<bool>>(false);
	bool mapped_check_ready_before_driver_ = false;
};

} // namespace cuda_criu
