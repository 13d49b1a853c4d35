// What the core needs from the operating system around the driver. SystemHost is the real one; unit
// tests substitute a fake.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/gpu.h"
#include "os/checkpoint_buffer.h"
#include "os/gpu_ledger.h"
#include "os/maps.h"
#include "os/memory.h"
#include "os/nvidia_files.h"

namespace cuda_criu {

// A restore thread let run by Host::let_run; stop() (or destruction) stops it again.
class RunningThread {
public:
	virtual ~RunningThread() = default;
	virtual Status stop() = 0;
	// A thread let run with a BufferPolicy: handles its stops (see os/thread_run.h); whether it made any.
	virtual bool tend() { return false; }
	virtual BufferReport buffer_report() const { return {}; }
};

// The file system under a directory (fstatvfs), for the dump's room preflight (core/space_check.h).
struct FreeSpace {
	uint64_t free_bytes = 0; // what an unprivileged writer may still use (f_bavail)
	uint64_t size_bytes = 0;
	std::string path; // the directory, for messages
};

struct TaskInfo {
	pid_t ns_pid = 0;                     // pid inside the task's own pid namespace
	uint64_t rss_bytes = 0;               // resident memory
	uint64_t anon_bytes = 0;              // resident private anonymous memory (RssAnon): CRIU writes it
	std::vector<unsigned> nvidia_minors;  // minors of the NVIDIA GPU device nodes it holds open
	bool stopped = false; // state T or t: at a dump's pause, before CRIU interrupts it, a group stop (SIGSTOP)
};

// What a process holds of NVIDIA device files, as /proc shows it (root only; os/nvidia_files.h).
struct HeldDeviceFiles {
	pid_t ns_pid = 0; // the pid inside its own pid namespace; 0 when unknown
	std::vector<DeviceMapping> mappings;
	std::vector<DeviceFd> fds;
};

class Host {
public:
	virtual ~Host() = default;
	// Whether pid has libcuda (NVML) mapped; no driver call.
	virtual bool uses_libcuda(pid_t pid) = 0;
	virtual bool uses_nvml(pid_t pid) = 0;
	virtual TaskInfo task_info(pid_t pid) = 0;
	// Lets the (ptrace-stopped) thread tid run; see os/thread_run.h.
	virtual Result<std::unique_ptr<RunningThread>> let_run(pid_t tid, std::optional<BufferPolicy> buffer) = 0;
	// The processes this CRIU process holds ptrace-stopped among the descendants of itself and of its
	// parent (a tree restored as CRIU's child, or as its sibling with --restore-sibling as runc does).
	virtual std::vector<pid_t> stopped_tasks() = 0;
	virtual void kill(pid_t pid) = 0;
	// Whether the process still exists (and is not a zombie).
	virtual bool alive(pid_t pid) = 0;
	// The children of every thread of pid (/proc/PID/task/*/children); empty when unknown.
	virtual std::vector<pid_t> children(pid_t pid) = 0;
	// CPU time of one thread of pid in clock ticks (user + system); 0 when unknown.
	virtual uint64_t thread_cpu_ticks(pid_t pid, pid_t tid) = 0;
	// MemAvailable of the machine, and the memory cgroup that leaves pid the least room (os/memory.h).
	virtual std::optional<uint64_t> available_memory() = 0;
	// The transparent huge page mode for PMD-sized anonymous pages (always, madvise, never; os/thp.h),
	// or an error saying why it is unknown.
	virtual Result<std::string> thp_mode() = 0;
	virtual std::optional<CgroupRoom> memory_cgroup(pid_t pid) = 0;
	// Every GPU the kernel driver has, whatever CUDA_VISIBLE_DEVICES says: see kernel_gpus() in os/nvidia.h.
	virtual std::vector<GpuInfo> machine_gpus() = 0;
	// Minors of the NVIDIA GPU device nodes in the /dev of the task's mount namespace (empty: none, or
	// unknown). A container given some GPUs has only their nodes: its driver never knew the others.
	virtual std::vector<unsigned> dev_gpu_minors(pid_t pid) = 0;
	// The task's memory mappings (/proc/PID/maps); empty when they cannot be read (then no memory is
	// mapped from the image at restore).
	virtual std::vector<Mapping> memory_map(pid_t pid) = 0;
	// The pages of files the task has mapped and in use, from its memory map `maps`, and their read-ahead
	// at restore (os/file_pages.h; at most max_bytes, until stop; returns the bytes asked for). Hints: an
	// empty list or nothing read where /proc cannot tell.
	virtual std::vector<MemoryRange> mapped_file_pages(pid_t pid, const std::vector<Mapping> &maps,
							   size_t max_ranges) = 0;
	virtual uint64_t read_file_pages_ahead(pid_t pid, const std::vector<MemoryRange> &ranges, uint64_t max_bytes,
					       const std::atomic<bool> &stop) = 0;
	// Copies of the GPU state between the plugin and a stopped process (os/process_memory.h).
	virtual Status read_memory(pid_t pid, uint64_t addr, void *buf, size_t len) = 0;
	virtual Status write_memory(pid_t pid, uint64_t addr, const void *buf, size_t len) = 0;
	// The room left on the file system of the directory dir_fd; an error when it cannot be told (a
	// file system that reports no size, an fd that is no directory).
	virtual Result<FreeSpace> free_space_at(int dir_fd) = 0;
	// This process's command line (CRIU's own: its options); empty when unknown.
	virtual std::vector<std::string> command_line() = 0;
	// Whether this machine has an NVIDIA driver (or libcuda_path names a library file), and the kernel
	// driver's version ("" when unknown); no dlopen (os/nvidia.h).
	virtual bool nvidia_driver_present(const std::string &libcuda_path) = 0;
	virtual std::string driver_version() = 0;
	// Whether the file open as fd (stat st) is an NVIDIA device file, and the path it was opened with
	// ("" when unknown): os/nvidia_files.h.
	virtual bool is_nvidia_device_file(int fd, const struct stat &st) = 0;
	virtual std::string fd_path(int fd) = 0;
	// The processes this process holds ptrace-attached (CRIU's seized tree), in pid order.
	virtual std::vector<pid_t> traced_processes() = 0;
	virtual HeldDeviceFiles nvidia_device_files(pid_t pid) = 0;
	// Whether fd_a of process a and fd_b of process b are one open file (kcmp KCMP_FILE: one a fork
	// shared); nullopt when the kernel cannot tell.
	virtual std::optional<bool> same_open_file(pid_t a, int fd_a, pid_t b, int fd_b) = 0;
	// The start addresses of pid's mappings of NVIDIA device files (root only).
	virtual std::vector<unsigned long> nvidia_device_mappings(pid_t pid) = 0;
	// The driver's legacy CUDA IPC files pid maps (os/maps.h); empty: none, or its maps unreadable.
	virtual std::vector<IpcFileMapping> cuda_ipc_files(pid_t pid) = 0;
	// Every process that maps the file dev:inode, in pid order. Reads the maps of every process on the
	// machine: asked only about a file some process maps.
	virtual std::vector<pid_t> processes_mapping(const std::string &dev, uint64_t inode) = 0;
	// Whether pid holds the file dev:inode (as /proc/PID/maps writes them) open as an fd; false also when
	// its fds cannot be read.
	virtual bool holds_file(pid_t pid, const std::string &dev, uint64_t inode) = 0;
	// The pid namespace pid lives in, as its /proc/PID/ns/pid link reads ("pid:[4026531836]"); "" when
	// unknown.
	virtual std::string pid_namespace(pid_t pid) = 0;
	// The machine's ledger of GPU memory that restores in progress are about to take (os/gpu_ledger.h):
	// decide runs under its lock; what it returns is held until the result settles or releases it (null:
	// nothing held, the ledger could not be used).
	virtual Result<std::shared_ptr<GpuReservations>> reserve_gpu_memory(const GpuLedgerPlace &place,
									   const ReserveDecision &decide) = 0;
	// Whether pid descends from ancestor now (its parent, or its parent's, ...): a process that a CRIU
	// is restoring descends from that CRIU until the restore ends.
	virtual bool descends_from(pid_t pid, pid_t ancestor) = 0;
};

class SystemHost final : public Host {
public:
	bool uses_libcuda(pid_t pid) override;
	bool uses_nvml(pid_t pid) override;
	TaskInfo task_info(pid_t pid) override;
	Result<std::unique_ptr<RunningThread>> let_run(pid_t tid, std::optional<BufferPolicy> buffer) override;
	std::vector<pid_t> stopped_tasks() override;
	void kill(pid_t pid) override;
	bool alive(pid_t pid) override;
	std::vector<pid_t> children(pid_t pid) override;
	uint64_t thread_cpu_ticks(pid_t pid, pid_t tid) override;
	std::optional<uint64_t> available_memory() override;
	Result<std::string> thp_mode() override;
	std::optional<CgroupRoom> memory_cgroup(pid_t pid) override;
	std::vector<GpuInfo> machine_gpus() override;
	std::vector<unsigned> dev_gpu_minors(pid_t pid) override;
	std::vector<Mapping> memory_map(pid_t pid) override;
	std::vector<MemoryRange> mapped_file_pages(pid_t pid, const std::vector<Mapping> &maps, size_t max_ranges) override;
	uint64_t read_file_pages_ahead(pid_t pid, const std::vector<MemoryRange> &ranges, uint64_t max_bytes,
				       const std::atomic<bool> &stop) override;
	Status read_memory(pid_t pid, uint64_t addr, void *buf, size_t len) override;
	Status write_memory(pid_t pid, uint64_t addr, const void *buf, size_t len) override;
	Result<FreeSpace> free_space_at(int dir_fd) override;
	std::vector<std::string> command_line() override;
	bool nvidia_driver_present(const std::string &libcuda_path) override;
	std::string driver_version() override;
	bool is_nvidia_device_file(int fd, const struct stat &st) override;
	std::string fd_path(int fd) override;
	std::vector<pid_t> traced_processes() override;
	HeldDeviceFiles nvidia_device_files(pid_t pid) override;
	std::optional<bool> same_open_file(pid_t a, int fd_a, pid_t b, int fd_b) override;
	std::vector<unsigned long> nvidia_device_mappings(pid_t pid) override;
	std::vector<IpcFileMapping> cuda_ipc_files(pid_t pid) override;
	std::vector<pid_t> processes_mapping(const std::string &dev, uint64_t inode) override;
	bool holds_file(pid_t pid, const std::string &dev, uint64_t inode) override;
	std::string pid_namespace(pid_t pid) override;
	Result<std::shared_ptr<GpuReservations>> reserve_gpu_memory(const GpuLedgerPlace &place,
								   const ReserveDecision &decide) override;
	bool descends_from(pid_t pid, pid_t ancestor) override;
};

} // namespace cuda_criu
