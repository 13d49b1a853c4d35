#include "os/proc.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "base/text.h"
#include "os/dir.h"

namespace cuda_criu {

bool maps_libcuda(pid_t pid) { return maps_library(pid, "libcuda.so"); }

bool maps_library(pid_t pid, const char *name_prefix)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	FILE *f = std::fopen(path, "re");
	if (!f)
		return false;
	char line[4096];
	bool found = false;
	while (!found && std::fgets(line, sizeof(line), f)) {
		const char *slash = std::strrchr(line, '/');
		found = slash && std::strncmp(slash + 1, name_prefix, std::strlen(name_prefix)) == 0;
	}
	std::fclose(f);
	return found;
}

Result<TaskStatus> read_task_status(pid_t tid)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/status", tid);
	auto text = read_small_file(path);
	if (!text)
		return std::move(text).error();
	std::istringstream f(*text);
	TaskStatus st;
	std::string line;
	while (std::getline(f, line)) {
		auto value = [&](const char *key) -> const char * {
			size_t n = std::strlen(key);
			return line.compare(0, n, key) == 0 ? line.c_str() + n : nullptr;
		};
		if (const char *v = value("TracerPid:"))
			st.tracer = std::atoi(v);
		else if (const char *v = value("Tgid:"))
			st.tgid = std::atoi(v);
		else if (const char *v = value("Seccomp:"))
			st.seccomp = std::atoi(v);
		else if (const char *v = value("State:")) {
			while (*v == ' ' || *v == '\t')
				v++;
			st.state = *v;
		} else if (const char *v = value("VmRSS:")) {
			st.rss_bytes = std::strtoull(v, nullptr, 10) * 1024;
		} else if (const char *v = value("RssAnon:")) {
			st.anon_bytes = std::strtoull(v, nullptr, 10) * 1024;
		} else if (const char *v = value("NSpid:")) {
			std::istringstream in(v);
			pid_t p = 0;
			while (in >> p)
				st.innermost_pid = p;
		}
	}
	return st;
}

std::vector<pid_t> children_of(pid_t pid)
{
	std::vector<pid_t> out;
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/task", pid);
	for (const std::string &tid : dir_entries(path)) {
		auto text = read_small_file(std::string(path) + "/" + tid + "/children");
		std::istringstream f(text ? *text : std::string());
		pid_t child = 0;
		while (f >> child)
			out.push_back(child);
	}
	return out;
}

pid_t parent_of(pid_t pid)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/status", pid);
	auto text = read_small_file(path);
	std::istringstream f(text ? *text : std::string());
	std::string line;
	while (std::getline(f, line))
		if (line.compare(0, 5, "PPid:") == 0)
			return std::atoi(line.c_str() + 5);
	return 0;
}

bool for_each_line(const std::string &path, const std::function<void(std::istringstream &fields)> &on_line,
		   size_t max_bytes)
{
	auto text = read_small_file(path, max_bytes);
	if (!text)
		return false;
	std::istringstream lines(*text);
	std::string line;
	while (std::getline(lines, line)) {
		std::istringstream fields(line);
		on_line(fields);
	}
	return true;
}

uint64_t start_time_of(pid_t pid)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	auto text = read_small_file(path);
	if (!text)
		return 0;
	std::string stat = text->substr(0, text->find('\n'));
	// The command name may hold spaces and parentheses: the fields start after its last ')'.
	size_t end = stat.rfind(')');
	if (end == std::string::npos)
		return 0;
	std::istringstream rest(stat.substr(end + 1));
	std::string field;
	for (int i = 3; i <= 22 && rest >> field; i++)
		if (i == 22)
			return std::strtoull(field.c_str(), nullptr, 10);
	return 0;
}

uint64_t thread_cpu_ticks(pid_t pid, pid_t tid)
{
	auto text = read_small_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
	if (!text)
		return 0;
	// The command name may hold spaces and parentheses: the fields start after its last ')'.
	size_t end = text->rfind(')');
	if (end == std::string::npos)
		return 0;
	std::istringstream rest(text->substr(end + 1));
	std::string field;
	uint64_t ticks = 0;
	for (int i = 3; i <= 15 && rest >> field; i++)
		if (i >= 14) // utime, stime
			ticks += std::strtoull(field.c_str(), nullptr, 10);
	return ticks;
}

bool process_exists(pid_t pid)
{
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d", pid);
	struct stat st;
	return stat(path, &st) == 0;
}

std::vector<pid_t> processes_traced_by(pid_t tracer)
{
	std::vector<pid_t> pids;
	for (pid_t pid : proc_pids()) {
		auto st = read_task_status(pid);
		if (st && st->tracer == tracer)
			pids.push_back(pid);
	}
	std::sort(pids.begin(), pids.end());
	return pids;
}

} // namespace cuda_criu
