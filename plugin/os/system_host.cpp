#include "os/host.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "os/nvidia.h"
#include "os/proc.h"
#include "os/thread_run.h"

namespace cuda_criu {
namespace {

constexpr unsigned kNvidiaMajor = 195;
constexpr unsigned kNvidiaCtlMinor = 255;

class ThreadRunHandle final : public RunningThread {
public:
	explicit ThreadRunHandle(ThreadRun run) : run_(std::move(run)) {}
	Status stop() override { return run_.stop(); }

private:
	ThreadRun run_;
};

} // namespace

bool is_nvidia_gpu_node(const struct stat &st)
{
	return S_ISCHR(st.st_mode) && major(st.st_rdev) == kNvidiaMajor && minor(st.st_rdev) < kNvidiaCtlMinor;
}

bool SystemHost::uses_libcuda(pid_t pid) { return maps_libcuda(pid); }

namespace {

// The minors of the NVIDIA GPU nodes in dir (a process's /dev, seen through /proc/PID/root).
std::vector<unsigned> gpu_nodes_in(const std::string &dir)
{
	std::set<unsigned> minors;
	if (DIR *d = opendir(dir.c_str())) {
		while (dirent *de = readdir(d)) {
			struct stat st;
			if (std::strncmp(de->d_name, "nvidia", 6) == 0 && fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
			    is_nvidia_gpu_node(st))
				minors.insert(minor(st.st_rdev));
		}
		closedir(d);
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
	}
	std::string dir = "/proc/" + std::to_string(pid) + "/fd";
	DIR *d = opendir(dir.c_str());
	if (!d)
		return info;
	std::set<unsigned> minors;
	while (dirent *de = readdir(d)) {
		if (de->d_name[0] == '.')
			continue;
		// Only a character device of the NVIDIA major is a GPU: a file that is merely named like one
		// (/tmp/nvidia0) says nothing about the GPUs a process uses.
		struct stat st;
		if (fstatat(dirfd(d), de->d_name, &st, 0) == 0 && is_nvidia_gpu_node(st))
			minors.insert(minor(st.st_rdev));
	}
	closedir(d);
	info.nvidia_minors.assign(minors.begin(), minors.end());
	info.reachable_minors = gpu_nodes_in("/proc/" + std::to_string(pid) + "/root/dev");
	return info;
}

Result<std::unique_ptr<RunningThread>> SystemHost::let_run(pid_t tid)
{
	auto run = ThreadRun::start(tid);
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

std::vector<GpuInfo> SystemHost::machine_gpus() { return kernel_gpus(); }

} // namespace cuda_criu
