// In-process fakes of the driver and the host for unit tests of the core.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "driver/driver.h"
#include "os/host.h"

namespace cuda_criu::testing {

// A driver with the real one's state machine: running -lock-> locked -checkpoint-> checkpointed
// -restore-> locked -unlock-> running; a call in the wrong state fails like CUDA_ERROR_ILLEGAL_STATE.
// Checkpoint and restore also fail unless the host let the process's restore thread run.
class FakeDriver final : public Driver {
public:
	struct Proc {
		CudaState state = CudaState::Running;
		pid_t tid = 0;
	};
	std::map<pid_t, Proc> procs;
	std::map<std::string, std::set<pid_t>> fail; // op -> pids failing it (0: every pid)
	std::vector<std::string> calls;              // "lock 10", "checkpoint 10", ...
	std::set<pid_t> *running_threads = nullptr;  // the host's; checked by checkpoint/restore
	std::vector<GpuPair> last_pairs;
	// op -> ms each call of it sleeps before it acts (a slow or hung driver); its caller may have given
	// up on it and gone by then.
	std::map<std::string, unsigned> delay_ms;
	mutable std::mutex mu;

	// Waits until no call is in flight (a test ends only after its abandoned calls returned).
	void wait_idle();

	void add(pid_t pid, CudaState s = CudaState::Running) { procs[pid] = {s, pid + 1000}; }
	CudaState state_of(pid_t pid) { return procs.at(pid).state; }

	Result<pid_t> restore_thread_id(pid_t pid) override;
	Result<CudaState> state(pid_t pid) override;
	Status lock(pid_t pid, unsigned timeout_ms) override;
	Status checkpoint(pid_t pid) override;
	Status restore(pid_t pid, const std::vector<GpuPair> &pairs) override;
	Status unlock(pid_t pid) override;
	std::string version() const override { return "999.1"; }
	Result<std::vector<GpuInfo>> gpus() override;
	std::map<std::string, uint64_t> free; // free_bytes() by uuid; 0 (unknown) when absent
	uint64_t free_bytes(const GpuUuid &uuid) override { return free.count(uuid.str()) ? free[uuid.str()] : 0; }
	std::optional<std::map<pid_t, std::vector<GpuUuid>>> contexts; // gpus_by_process() (default: unknown)
	std::optional<std::map<pid_t, std::vector<GpuUuid>>> gpus_by_process() override { return contexts; }
	std::optional<std::map<pid_t, uint64_t>> usage; // gpu_bytes_by_process() (default: unknown)
	std::optional<std::map<pid_t, uint64_t>> gpu_bytes_by_process() override { return usage; }
	std::map<std::string, std::map<pid_t, uint64_t>> usage_on; // gpu_bytes_on() by uuid (absent: unknown)
	std::optional<std::map<pid_t, uint64_t>> gpu_bytes_on(const GpuUuid &uuid) override
	{
		auto it = usage_on.find(uuid.str());
		return it == usage_on.end() ? std::nullopt : std::optional(it->second);
	}

private:
	class Call;
	std::condition_variable idle_;
	int in_flight_ = 0;
	Status step(const char *op, pid_t pid, CudaState from, CudaState to, bool needs_thread);
};

class FakeHost final : public Host {
public:
	std::set<pid_t> cuda_pids;        // pids with libcuda mapped
	std::set<pid_t> running_threads;  // restore threads currently let run
	std::set<pid_t> fail_let_run;     // tids whose let_run fails (thread gone)
	std::set<pid_t> fail_stop;        // tids whose stop after a let_run fails (the thread exited while it ran)
	std::vector<pid_t> stopped;       // what stopped_tasks() returns
	std::set<pid_t> killed;
	std::set<pid_t> dead;
	std::set<pid_t> stopped_pids;     // task_info().stopped: in a group stop (SIGSTOP)
	std::map<pid_t, pid_t> ns_pids;   // host pid -> ns pid (default: same)
	std::map<pid_t, std::vector<unsigned>> minors; // /dev/nvidiaN a process holds (default: none)
	std::map<pid_t, std::vector<unsigned>> reachable; // /dev/nvidiaN in its /dev (default: none)
	int let_runs = 0;
	std::map<pid_t, std::optional<BufferPolicy>> buffer_policies; // the last let_run's, per restore thread

	bool uses_libcuda(pid_t pid) override { return cuda_pids.count(pid) > 0; }
	std::set<pid_t> nvml_pids; // pids with NVML mapped
	bool uses_nvml(pid_t pid) override { return nvml_pids.count(pid) > 0; }
	TaskInfo task_info(pid_t pid) override;
	Result<std::unique_ptr<RunningThread>> let_run(pid_t tid, std::optional<BufferPolicy> buffer) override;
	Result<std::string> thp_mode() override { return thp; }
	Result<std::string> thp = std::string("madvise");
	std::vector<pid_t> stopped_tasks() override { return stopped; }
	void kill(pid_t pid) override { killed.insert(pid); }
	bool alive(pid_t pid) override { return !dead.count(pid); }
	std::map<pid_t, std::vector<pid_t>> kids; // children() (default: none)
	std::vector<pid_t> children(pid_t pid) override { return kids.count(pid) ? kids[pid] : std::vector<pid_t>{}; }
	std::map<pid_t, uint64_t> cpu_ticks; // thread_cpu_ticks() by tid (default: 0)
	std::mutex ticks_mu;                  // read by the progress watch while a test may set it
	uint64_t thread_cpu_ticks(pid_t pid, pid_t tid) override;
	std::optional<uint64_t> available; // available_memory() (default: unknown)
	std::optional<uint64_t> available_memory() override { return available; }
	std::map<pid_t, CgroupRoom> cgroups; // memory_cgroup() (default: no limit)
	std::optional<CgroupRoom> memory_cgroup(pid_t pid) override
	{
		if (auto it = cgroups.find(pid); it != cgroups.end())
			return it->second;
		return std::nullopt;
	}
	std::vector<GpuInfo> all_gpus; // machine_gpus()
	std::vector<GpuInfo> machine_gpus() override { return all_gpus; }
	std::vector<unsigned> dev_gpu_minors(pid_t pid) override { return reachable.count(pid) ? reachable[pid] : std::vector<unsigned>{}; }
	// memory_map(): each call takes the next snapshot of the pid (the last one repeats; none: empty).
	std::map<pid_t, std::vector<std::vector<Mapping>>> maps;
	std::mutex maps_mu; // checkpoint jobs read maps on worker threads
	std::vector<Mapping> memory_map(pid_t pid) override;
	// mapped_file_pages(): these per pid (none: empty); read_file_pages_ahead() notes each call.
	std::map<pid_t, std::vector<MemoryRange>> file_pages;
	std::vector<size_t> file_pages_max; // the max_ranges each call got
	struct ReadAhead {
		pid_t pid;
		std::vector<MemoryRange> ranges;
		uint64_t max_bytes;
	};
	std::vector<ReadAhead> read_aheads;
	std::mutex file_pages_mu;
	std::vector<MemoryRange> mapped_file_pages(pid_t pid, const std::vector<Mapping> &, size_t max_ranges) override
	{
		std::lock_guard<std::mutex> g(file_pages_mu);
		file_pages_max.push_back(max_ranges);
		return file_pages.count(pid) ? file_pages[pid] : std::vector<MemoryRange>{};
	}
	uint64_t read_file_pages_ahead(pid_t pid, const std::vector<MemoryRange> &ranges, uint64_t max_bytes,
				       const std::atomic<bool> &) override
	{
		std::lock_guard<std::mutex> g(file_pages_mu);
		read_aheads.push_back({pid, ranges, max_bytes});
		return total_bytes(ranges);
	}
	// Process memory, a byte map per pid: read_memory gives zeros where nothing was written, and fails
	// for a pid in memory_fails.
	std::map<pid_t, std::map<uint64_t, uint8_t>> memory;
	std::set<pid_t> memory_fails;
	std::mutex memory_mu;
	Status read_memory(pid_t pid, uint64_t addr, void *buf, size_t len) override;
	Status write_memory(pid_t pid, uint64_t addr, const void *buf, size_t len) override;
	std::map<pid_t, uint64_t> anon;   // task_info().anon_bytes (default: 1 MiB)
	// free_space_at(): this room, or space_error when set.
	FreeSpace space{uint64_t{1} << 40, uint64_t{1} << 40, "/images"};
	std::optional<Error> space_error;
	std::vector<int> space_asked; // the dir fds asked
	Result<FreeSpace> free_space_at(int dir_fd) override;
	std::vector<std::string> args; // command_line()
	std::vector<std::string> command_line() override { return args; }
	bool driver = true;         // nvidia_driver_present()
	std::string kernel_version; // driver_version() (default: unknown)
	bool nvidia_driver_present(const std::string &) override { return driver; }
	std::string driver_version() override { return kernel_version; }
	std::set<int> device_fds;             // fds is_nvidia_device_file() takes for NVIDIA device files
	std::map<int, std::string> fd_paths;  // fd_path() (default: unknown)
	std::vector<pid_t> traced;            // traced_processes()
	std::map<pid_t, HeldDeviceFiles> held; // nvidia_device_files() (default: none)
	std::map<pid_t, std::vector<unsigned long>> device_mappings; // nvidia_device_mappings() (default: none)
	// cuda_ipc_files() by pid (default: none); processes_mapping() finds the pids here that map the file.
	std::map<pid_t, std::vector<IpcFileMapping>> ipc_files;
	std::vector<IpcFileMapping> cuda_ipc_files(pid_t pid) override
	{
		return ipc_files.count(pid) ? ipc_files[pid] : std::vector<IpcFileMapping>{};
	}
	std::vector<pid_t> processes_mapping(const std::string &dev, uint64_t inode) override;
	// holds_file(): the files (inode) each pid holds open (default: none; a dead pid holds none).
	std::map<pid_t, std::set<uint64_t>> open_inodes;
	bool holds_file(pid_t pid, const std::string &, uint64_t inode) override
	{
		return !dead.count(pid) && open_inodes.count(pid) && open_inodes[pid].count(inode);
	}
	std::map<pid_t, std::string> pid_namespaces; // pid_namespace() (default: "pid:[4026531836]")
	std::string pid_namespace(pid_t pid) override
	{
		return pid_namespaces.count(pid) ? pid_namespaces[pid] : std::string("pid:[4026531836]");
	}
	// The GPU reservation ledger: what other restores hold (owner != 0), and this one's (owner 0); shared
	// with the reservations handed out, which the driver's workers settle.
	struct Ledger {
		std::mutex mu;
		std::vector<GpuReservation> entries;
		std::vector<std::vector<GpuReservation>> reserved; // what each reserve_gpu_memory() recorded
		std::vector<pid_t> settled;                        // the processes settled, in order
		GpuLedgerPlace place;                              // where the last reserve was asked to look
		bool usable = true;                                // false: as a ledger that cannot be used
		std::function<void()> on_lock;                     // runs once the lock is "taken", before decide
	};
	std::shared_ptr<Ledger> ledger = std::make_shared<Ledger>();
	std::set<std::pair<pid_t, pid_t>> descendants; // descends_from(): (pid, ancestor) pairs that hold
	bool descends_from(pid_t pid, pid_t ancestor) override { return descendants.count({pid, ancestor}) > 0; }
	Result<std::shared_ptr<GpuReservations>> reserve_gpu_memory(const GpuLedgerPlace &place,
								   const ReserveDecision &decide) override;
	// same_open_file(): (pid, fd) -> the open file it refers to; same number, same file (default: unknown)
	std::map<std::pair<pid_t, int>, int> open_files;
	std::optional<bool> same_open_file(pid_t a, int fd_a, pid_t b, int fd_b) override
	{
		auto x = open_files.find({a, fd_a}), y = open_files.find({b, fd_b});
		if (x == open_files.end() || y == open_files.end())
			return std::nullopt;
		return x->second == y->second;
	}
	bool is_nvidia_device_file(int fd, const struct stat &) override { return device_fds.count(fd) > 0; }
	std::string fd_path(int fd) override { return fd_paths.count(fd) ? fd_paths[fd] : std::string(); }
	std::vector<pid_t> traced_processes() override { return traced; }
	HeldDeviceFiles nvidia_device_files(pid_t pid) override { return held.count(pid) ? held[pid] : HeldDeviceFiles{}; }
	std::vector<unsigned long> nvidia_device_mappings(pid_t pid) override
	{
		return device_mappings.count(pid) ? device_mappings[pid] : std::vector<unsigned long>{};
	}
};

} // namespace cuda_criu::testing
