#include "os/host.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <linux/kcmp.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "base/format.h"
#include "base/log.h"
#include "base/text.h"
#include "os/dir.h"
#include "os/file_pages.h"
#include "os/nvidia.h"
#include "os/nvidia_files.h"
#include "os/proc.h"
#include "os/process_memory.h"
#include "os/thp.h"
#include "os/thread_run.h"

namespace cuda_criu {
namespace {

class ThreadRunHandle final : public RunningThread {
public:
	explicit ThreadRunHandle(ThreadRun run) : run_(std::move(run)) {}
	Status stop() override { return run_.stop(); }
	bool tend() override { return run_.tend(); }
	BufferReport buffer_report() const override { return run_.buffer_report(); }

private:
	ThreadRun run_;
};

} // namespace

bool SystemHost::uses_libcuda(pid_t pid) { return maps_libcuda(pid); }

bool SystemHost::uses_nvml(pid_t pid) { return maps_library(pid, "libnvidia-ml.so"); }

std::vector<pid_t> SystemHost::children(pid_t pid) { return children_of(pid); }

uint64_t SystemHost::thread_cpu_ticks(pid_t pid, pid_t tid) { return cuda_criu::thread_cpu_ticks(pid, tid); }

std::optional<uint64_t> SystemHost::available_memory() { return host_available_bytes(); }

Result<std::string> SystemHost::thp_mode()
{
	auto thp = read_thp_settings();
	if (!thp)
		return std::move(thp).error();
	return thp->pmd_mode;
}

std::optional<CgroupRoom> SystemHost::memory_cgroup(pid_t pid) { return tightest_memory_cgroup(pid); }

namespace {

// The minors of the NVIDIA GPU device nodes among the entries of dir, by what they are, not by their
// names (a file merely named like one, /tmp/nvidia0, is none). stat_flags: 0 to follow links (the fds of
// /proc/PID/fd), AT_SYMLINK_NOFOLLOW for the nodes themselves.
std::vector<unsigned> gpu_minors_in(const std::string &dir, int stat_flags)
{
	std::set<unsigned> minors;
	if (auto d = Dir::open(dir))
		while (const char *name = d->next()) {
			struct stat st;
			if (fstatat(d->fd(), name, &st, stat_flags) == 0 && is_nvidia_gpu_node(st))
				minors.insert(minor(st.st_rdev));
		}
	return {minors.begin(), minors.end()};
}

} // namespace

TaskInfo SystemHost::task_info(pid_t pid)
{
	TaskInfo info;
	if (auto st = read_task_status(pid)) {
		info.ns_pid = st->innermost_pid ? st->innermost_pid : pid;
		info.rss_bytes = st->rss_bytes;
		info.anon_bytes = st->anon_bytes;
		info.stopped = st->state == 'T' || st->state == 't'; // 't': stopped, then seized by CRIU
	}
	info.nvidia_minors = gpu_minors_in("/proc/" + std::to_string(pid) + "/fd", 0);
	return info;
}

std::vector<unsigned> SystemHost::dev_gpu_minors(pid_t pid)
{
	return gpu_minors_in("/proc/" + std::to_string(pid) + "/root/dev", AT_SYMLINK_NOFOLLOW);
}

Result<std::unique_ptr<RunningThread>> SystemHost::let_run(pid_t tid, std::optional<BufferPolicy> buffer)
{
	auto run = ThreadRun::start(tid, buffer);
	if (!run)
		return std::move(run).error();
	return std::unique_ptr<RunningThread>(new ThreadRunHandle(std::move(*run)));
}

std::vector<pid_t> SystemHost::stopped_tasks()
{
	pid_t self = getpid();
	std::vector<pid_t> out, todo = children_of(self);
	if (pid_t parent = parent_of(self); parent > 1)
		for (pid_t sibling : children_of(parent))
			if (sibling != self)
				todo.push_back(sibling);
	std::set<pid_t> seen;
	while (!todo.empty()) {
		pid_t p = todo.back();
		todo.pop_back();
		if (!seen.insert(p).second)
			continue;
		auto st = read_task_status(p);
		if (!st || st->tracer != gettid())
			continue; // not ours; its descendants are not restored tasks either
		out.push_back(p);
		for (pid_t c : children_of(p))
			todo.push_back(c);
	}
	return out;
}

void SystemHost::kill(pid_t pid) { ::kill(pid, SIGKILL); }

bool SystemHost::alive(pid_t pid)
{
	auto st = read_task_status(pid);
	return st && st->state != 'Z' && st->state != 'X';
}

std::vector<Mapping> SystemHost::memory_map(pid_t pid)
{
	auto maps = read_maps(pid);
	return maps ? std::move(*maps) : std::vector<Mapping>();
}

std::vector<MemoryRange> SystemHost::mapped_file_pages(pid_t pid, const std::vector<Mapping> &maps, size_t max_ranges)
{
	auto pages = cuda_criu::mapped_file_pages(pid, maps, max_ranges);
	if (!pages)
		LOG_DEBUG("pid %d: its mapped files' pages in use cannot be told: %s", pid, pages.error().message().c_str());
	return pages ? std::move(*pages) : std::vector<MemoryRange>();
}

uint64_t SystemHost::read_file_pages_ahead(pid_t pid, const std::vector<MemoryRange> &ranges, uint64_t max_bytes,
					   const std::atomic<bool> &stop)
{
	return cuda_criu::read_file_pages_ahead(pid, ranges, max_bytes, stop);
}

std::vector<IpcFileMapping> SystemHost::cuda_ipc_files(pid_t pid) { return cuda_criu::cuda_ipc_files(memory_map(pid)); }

std::vector<pid_t> SystemHost::processes_mapping(const std::string &dev, uint64_t inode)
{
	std::vector<pid_t> out;
	for (pid_t pid : proc_pids()) {
		// A cheap look for the device and inode first: most processes map no such file.
		auto text = read_small_file("/proc/" + std::to_string(pid) + "/maps", 64 << 20);
		std::string key = " " + dev + " " + std::to_string(inode) + " ";
		if (!text || text->find(key) == std::string::npos)
			continue;
		for (const Mapping &m : parse_maps(*text))
			if (m.dev == dev && m.inode == inode) {
				out.push_back(pid);
				break;
			}
	}
	std::sort(out.begin(), out.end());
	return out;
}

bool SystemHost::holds_file(pid_t pid, const std::string &dev, uint64_t inode)
{
	auto fds = Dir::open("/proc/" + std::to_string(pid) + "/fd");
	if (!fds)
		return false;
	while (const char *name = fds->next()) {
		struct stat st;
		// The fd's link leads to the file itself, also one deleted or in another mount namespace.
		if (fstatat(fds->fd(), name, &st, 0) == 0 && st.st_ino == inode &&
		    format("%02x:%02x", major(st.st_dev), minor(st.st_dev)) == dev)
			return true;
	}
	return false;
}

std::string SystemHost::pid_namespace(pid_t pid)
{
	std::string link = "/proc/" + std::to_string(pid) + "/ns/pid";
	char target[64];
	ssize_t n = readlink(link.c_str(), target, sizeof(target));
	return n > 0 && static_cast<size_t>(n) < sizeof(target) ? std::string(target, static_cast<size_t>(n)) : std::string();
}

Result<std::shared_ptr<GpuReservations>> SystemHost::reserve_gpu_memory(const GpuLedgerPlace &place,
									const ReserveDecision &decide)
{
	return reserve_in_ledger(place, decide);
}

bool SystemHost::descends_from(pid_t pid, pid_t ancestor)
{
	for (int depth = 0; pid > 1 && depth < 64; depth++) // a restored tree is shallow: give up past 64
		if ((pid = parent_of(pid)) == ancestor)
			return true;
	return false;
}

std::vector<GpuInfo> SystemHost::machine_gpus() { return kernel_gpus(); }

Status SystemHost::read_memory(pid_t pid, uint64_t addr, void *buf, size_t len)
{
	return read_process_memory(pid, addr, buf, len);
}

Status SystemHost::write_memory(pid_t pid, uint64_t addr, const void *buf, size_t len)
{
	return write_process_memory(pid, addr, buf, len);
}

Result<FreeSpace> SystemHost::free_space_at(int dir_fd)
{
	FreeSpace out;
	char link[64], path[4096];
	std::snprintf(link, sizeof(link), "/proc/self/fd/%d", dir_fd);
	ssize_t n = readlink(link, path, sizeof(path) - 1);
	out.path = n > 0 ? std::string(path, static_cast<size_t>(n)) : "the image directory";
	struct statvfs st {};
	if (fstatvfs(dir_fd, &st) != 0)
		return errno_error("statfs %s", out.path.c_str());
	// A file system without a size (some FUSE, proc-like or network ones) says nothing about its room.
	if (st.f_blocks == 0)
		return make_error(ENOTSUP, "the file system of %s reports no size", out.path.c_str());
	uint64_t unit = st.f_frsize ? st.f_frsize : st.f_bsize;
	out.free_bytes = static_cast<uint64_t>(st.f_bavail) * unit;
	out.size_bytes = static_cast<uint64_t>(st.f_blocks) * unit;
	return out;
}

std::vector<std::string> SystemHost::command_line()
{
	std::vector<std::string> args;
	auto text = read_small_file("/proc/self/cmdline", 1 << 20);
	if (!text)
		return args;
	for (size_t at = 0; at < text->size();) {
		size_t end = text->find('\0', at);
		if (end == std::string::npos)
			end = text->size();
		args.push_back(text->substr(at, end - at));
		at = end + 1;
	}
	return args;
}

bool SystemHost::nvidia_driver_present(const std::string &libcuda_path)
{
	return cuda_criu::nvidia_driver_present(libcuda_path);
}

std::string SystemHost::driver_version() { return kernel_driver_version(); }

bool SystemHost::is_nvidia_device_file(int fd, const struct stat &st) { return cuda_criu::is_nvidia_device_file(fd, st); }

std::string SystemHost::fd_path(int fd) { return cuda_criu::fd_path(fd); }

std::vector<pid_t> SystemHost::traced_processes() { return processes_traced_by(getpid()); }

HeldDeviceFiles SystemHost::nvidia_device_files(pid_t pid)
{
	HeldDeviceFiles held;
	if (auto st = read_task_status(pid))
		held.ns_pid = st->innermost_pid;
	held.mappings = nvidia_device_mapping_list(pid);
	held.fds = nvidia_device_fds(pid);
	return held;
}

std::vector<unsigned long> SystemHost::nvidia_device_mappings(pid_t pid) { return cuda_criu::nvidia_device_mappings(pid); }

std::optional<bool> SystemHost::same_open_file(pid_t a, int fd_a, pid_t b, int fd_b)
{
	long r = syscall(SYS_kcmp, a, b, KCMP_FILE, fd_a, fd_b);
	if (r < 0)
		return std::nullopt;
	return r == 0;
}

} // namespace cuda_criu
