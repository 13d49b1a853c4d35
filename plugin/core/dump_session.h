// The dump: drives every CUDA process through the driver's state machine (running -> locked ->
// checkpointed) and, when the dump fails or the tasks go on running, puts each back as it was found.
// Pure C++: no CRIU header; the ABI layer calls it from the hooks.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "core/driver_calls.h"
#include "core/dump_preflight.h"
#include "core/gpu_store.h"
#include "core/guard.h"
#include "core/options.h"
#include "driver/driver.h"
#include "image/gpu_image.h"
#include "image/record.h"
#include "os/host.h"

namespace cuda_criu {

// Starts the guard that outlives CRIU (core/guard.h); empty in tests.
using GuardSource = std::function<Result<DumpGuard>()>;
// CRIU's criu_dump_skip_pages(pid, start, end) (criu-patches/0004): 0, or -errno (-EOPNOTSUPP: this dump
// cannot leave pages out). Empty on a CRIU without it.
using SkipPages = std::function<int(pid_t pid, uint64_t start, uint64_t end)>;
// Milliseconds left before CRIU's seize alarm (alarm(--timeout)) fires; 0 when none is armed.
using AlarmClock = std::function<unsigned()>;

class DumpSession {
public:
	// image_dir_fd: CRIU's image directory (CRIU owns it), for the room preflight; -1: none (tests).
	DumpSession(Options options, Host &host, DriverSource driver, GuardSource guard = {},
		    AlarmClock alarm = {}, int image_dir_fd = -1);

	// PAUSE_DEVICES: locks pid if it is a CUDA process. false: not a CUDA process (nothing done). A pid
	// paused already (CRIU pauses again after a failed seize retry) is answered true again.
	Result<bool> pause(pid_t pid);
	// CHECKPOINT_DEVICES: the first call checkpoints every paused process at once; every call answers
	// for its pid. false: not one of ours.
	Result<bool> checkpoint(pid_t pid);
	// exit(DUMP): when the dump failed or the tasks go on running, returns every process to the state it
	// was found in. Errors name each process that could not be returned.
	Status finish(bool dump_failed, bool leave_running);
	// After the checkpoint, once: where the gpu-image option and CRIU allow, stores the checkpointed
	// processes' GPU state in the plugin's own files in dir_fd (core/gpu_store.h) and has CRIU leave those
	// pages out of its pages images; otherwise logs why CRIU keeps them and records their checksums.
	Status store_gpu_image(int dir_fd, const SkipPages &skip);
	// The same in two steps, so that the write can run while CRIU dumps the tasks (criu-patches/0009):
	// leave_gpu_state_out, on CRIU's thread in CHECKPOINT_DEVICES, has CRIU leave the GPU state out of its
	// pages images and answers true when the plugin must then write it (write_gpu_image, on any thread
	// while the tasks stay stopped), or does all there is to do and answers false (CRIU's pages images keep
	// the GPU state, or there is none).
	Result<bool> leave_gpu_state_out(int dir_fd, const SkipPages &skip);
	Status write_gpu_image();

	// Whether pid may have its NVIDIA device files replaced by inert stand-ins (core/inherited_devices.h):
	// only when the driver said at its pause that it has no CUDA state and each NVIDIA file it holds is
	// one it shares with a CUDA process of the tree (inherited by a fork). Else an error naming pid and
	// why: a process without libcuda (NVML alone), one that opened its files itself, or a CUDA process
	// still holding one after its checkpoint.
	Status stand_ins_allowed(pid_t pid) const;

	bool has_cuda_processes() const { return !procs_.empty(); }
	ImageRecord image_record() const;
	std::string summary() const;

private:
	std::vector<GpuSaveTarget> gpu_save_targets(uint64_t *bytes) const;

	struct Proc {
		pid_t pid = 0;
		pid_t ns_pid = 0;
		pid_t restore_tid = 0;
		CudaState initial = CudaState::Running;
		bool locked_by_us = false;
		bool checkpointed_by_us = false;
		std::optional<Error> checkpoint_error;
		std::vector<GpuUuid> gpu_uuids;
		std::vector<GpuUuid> reachable_gpus; // GPUs whose nodes are in its /dev (empty: unknown)
		std::vector<DeviceFd> device_fds;    // its NVIDIA device files at its pause (before the lock)
		uint64_t rss_before = 0;
		uint64_t gpu_bytes = 0; // GPU memory in use before the checkpoint (NVML); 0 = unknown
		uint64_t state_bytes = 0;
		uint64_t lock_us = 0;
		uint64_t checkpoint_us = 0;
		std::vector<MemoryRange> checkpoint_ranges; // memory the checkpoint mapped (os/maps.h)
		std::vector<MemoryRange> file_pages;        // its mapped files' pages in use (os/file_pages.h)
	};

	Status load_driver(unsigned budget_ms);
	Result<bool> pause_cuda(pid_t pid, uint64_t deadline_us);
	void note_gpus(Proc &p, const TaskInfo &info, uint64_t deadline_us);
	Status lock(Proc &p, uint64_t deadline_us);
	Result<unsigned> pause_budget_ms(pid_t pid) const;
	Status checkpoint_all();
	void record_checkpoint(Proc &p, ProcResult result, Status &first_failure);
	std::optional<BufferPolicy> buffer_policy();
	static void log_buffer(pid_t pid, const BufferReport &r, uint64_t call_us);
	std::string state_now(pid_t pid, unsigned timeout_ms = kDriverGraceMs);
	std::vector<GpuRecord> machine_gpu_records(bool used) const;

	Options options_;
	Host &host_;
	DriverSource driver_source_;
	GuardSource guard_source_;
	AlarmClock alarm_;
	DumpGuard guard_; // its socket closes with the session; the guard then waits for CRIU to exit
	SharedDriver driver_; // shared with abandoned calls; null until loaded
	PhaseCost pause_cost_, checkpoint_cost_;
	std::vector<Proc> procs_; // in pause order
	// Processes with libcuda loaded that the driver said have no CUDA state: why their NVIDIA files may
	// not be stood in for (nullopt: they may).
	std::map<pid_t, std::optional<Error>> no_cuda_state_;
	pid_t first_pid_ = 0;     // the first pid CRIU paused: the root of the tree
	bool preflight_done_ = false;
	TreeGpuMemory gpu_memory_; // of each process before the dump (NVML)
	int image_dir_fd_ = -1;
	bool checkpointed_ = false;
	bool buffer_traced_ = false; // the checkpoint traced the restore threads for the driver's buffer
	uint64_t device_phase_us_ = 0;
	uint64_t rollback_us_ = 0;
	std::vector<GpuInfo> machine_gpus_; // the driver's list
	std::vector<GpuInfo> kernel_gpus_;  // Host::machine_gpus()
	bool gpus_listed_ = false;          // the three lists asked (note_gpus)
	std::map<pid_t, std::vector<GpuUuid>> contexts_; // GPUs each process has a context on (NVML; empty: unknown)
	std::string gpu_image_id_;  // set once the plugin stored the GPU state
	std::string gpu_checksums_id_; // set once it recorded checksums of the GPU state CRIU stores
	int gpu_image_dir_fd_ = -1;          // where it wrote them (CRIU's fd)
	int write_dir_fd_ = -1;              // where write_gpu_image writes them (CRIU's fd)
	std::vector<GpuDataFile> gpu_files_; // the data files it wrote
	std::string gpu_image_note_; // for the summary: what was stored, or who keeps the GPU state
};

} // namespace cuda_criu
