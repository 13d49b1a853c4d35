// Reading /proc: what the plugin learns about a task without a driver call.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "base/result.h"

namespace cuda_criu {

// Calls on_line with each line of the file at path (up to max_bytes of it) as a stream of its
// whitespace-separated fields; false when the file cannot be read.
bool for_each_line(const std::string &path, const std::function<void(std::istringstream &fields)> &on_line,
		   size_t max_bytes = 1 << 20);

// Whether pid has a library whose file name starts with "libcuda.so" mapped (the real driver's or a
// fake's). A process without it cannot be a CUDA process.
bool maps_libcuda(pid_t pid);
// Whether pid maps a file whose name starts with name_prefix ("libnvidia-ml.so").
bool maps_library(pid_t pid, const char *name_prefix);

// Fields of /proc/PID/status.
struct TaskStatus {
	pid_t tracer = 0;            // TracerPid
	pid_t tgid = 0;              // Tgid: the process of the task
	int seccomp = 0;             // Seccomp mode (0: disabled)
	pid_t innermost_pid = 0;     // last NSpid entry: the pid inside the task's own pid namespace
	char state = '?';            // first letter of State
	uint64_t rss_bytes = 0;      // VmRSS
	uint64_t anon_bytes = 0;     // RssAnon
};
Result<TaskStatus> read_task_status(pid_t tid);

// Children of every thread of pid (/proc/PID/task/*/children).
std::vector<pid_t> children_of(pid_t pid);

// Parent pid (PPid), or 0.
pid_t parent_of(pid_t pid);

// When pid started (starttime of /proc/PID/stat, in clock ticks since boot), or 0 when it does not
// exist. A pid reused by a later process has another start time.
uint64_t start_time_of(pid_t pid);

// CPU time (user + system, in clock ticks) a thread of pid has used; 0 when it cannot be read.
uint64_t thread_cpu_ticks(pid_t pid, pid_t tid);

// Whether /proc/PID exists.
bool process_exists(pid_t pid);

// The processes (thread-group leaders) that tracer has attached with ptrace, in pid order; empty when
// /proc cannot be listed.
std::vector<pid_t> processes_traced_by(pid_t tracer);

} // namespace cuda_criu
