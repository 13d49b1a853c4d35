#include "os/host.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

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

// "nvidia3" -> 3; anything else -> -1. Matches device nodes seen through a link target's name.
int nvidia_index(const char *name)
{
	if (std::strncmp(name, "nvidia", 6) != 0 || !name[6])
		return -1;
	int n = 0;
	for (const char *p = name + 6; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		n = n * 10 + (*p - '0');
	}
	return n;
}

} // namespace

bool SystemHost::uses_libcuda(pid_t pid) { return maps_libcuda(pid); }

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
		std::string fd = dir + "/" + de->d_name;
		struct stat st;
		if (stat(fd.c_str(), &st) != 0)
			continue;
		if (S_ISCHR(st.st_mode)) {
			if (major(st.st_rdev) == kNvidiaMajor && minor(st.st_rdev) < kNvidiaCtlMinor)
				minors.insert(minor(st.st_rdev));
			continue;
		}
		// Not a device node: a stand-in named like one (e.g. a test double's .../dev/nvidia0).
		char target[512];
		ssize_t n = readlink(fd.c_str(), target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		const char *base = std::strrchr(target, '/');
		int idx = nvidia_index(base ? base + 1 : target);
		if (idx >= 0 && static_cast<unsigned>(idx) < kNvidiaCtlMinor)
			minors.insert(static_cast<unsigned>(idx));
	}
	closedir(d);
	info.nvidia_minors.assign(minors.begin(), minors.end());
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

std::vector<GpuInfo> SystemHost::machine_gpus()
{
	std::vector<GpuInfo> out;
	DIR *d = opendir("/proc/driver/nvidia/gpus");
	if (!d)
		return out;
	auto value = [](const std::string &line) {
		size_t v = line.find_first_not_of(" \t", line.find(':') + 1);
		return v == std::string::npos ? std::string() : line.substr(v);
	};
	while (dirent *de = readdir(d)) {
		if (de->d_name[0] == '.')
			continue;
		std::ifstream f(std::string("/proc/driver/nvidia/gpus/") + de->d_name + "/information");
		std::string line;
		GpuInfo g;
		g.ordinal = -1;
		bool has_uuid = false;
		while (std::getline(f, line)) {
			if (line.rfind("Model:", 0) == 0)
				g.name = value(line);
			else if (line.rfind("Device Minor:", 0) == 0)
				g.ordinal = std::atoi(value(line).c_str());
			else if (line.rfind("Bus Location:", 0) == 0)
				g.pci_bus_id = value(line);
			else if (line.rfind("GPU UUID:", 0) == 0)
				if (auto u = GpuUuid::parse(value(line)))
					g.uuid = *u, has_uuid = true;
		}
		if (has_uuid && g.ordinal >= 0)
			out.push_back(g);
	}
	closedir(d);
	std::sort(out.begin(), out.end(), [](const GpuInfo &a, const GpuInfo &b) { return a.ordinal < b.ordinal; });
	return out;
}

} // namespace cuda_criu
