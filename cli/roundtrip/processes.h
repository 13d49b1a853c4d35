// The process tree the round trip works on. This program is a child subreaper: everything the program
// forks, everything `criu restore -d` brings back and the plugin's guard processes end up as its
// descendants. Pids are only ever signalled while they are known to be unreaped (a Child, or a process
// just found in /proc as a descendant).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "base/result.h"

namespace cuda_criu::cli::roundtrip {

// The process pid and its descendants, parents before children.
std::vector<pid_t> tree_of(pid_t root);

// The processes whose session or process group is id, read from /proc/PID/stat.
std::vector<pid_t> session_members(pid_t id);

bool is_zombie(pid_t pid);

// Reaps the children of this process that have ended, but keep: what ended of a cycle (CRIU's guard
// processes above all) must not pile up as zombies over many cycles.
void reap_ended_children(pid_t keep);

// Kills every descendant of this process and reaps them, for up to timeout_ms; false when some were
// still there then (their count in left).
bool kill_descendants(unsigned timeout_ms, size_t &left);

// argv[0] as execve needs it: a name without a slash is looked up in $PATH.
Result<std::string> resolve_program(const std::string &name);

// Runs argv (CRIU) with env added to ours and its output into out_fd; kills it after timeout_ms
// (ETIMEDOUT) or on a signal (EINTR). Returns its wait status. while_running: called every few
// milliseconds while it runs (e.g. to follow its log).
Result<int> run_tool(const std::vector<std::string> &argv, const std::vector<std::string> &env, int out_fd,
		     unsigned timeout_ms, const std::function<void()> &while_running = {});

} // namespace cuda_criu::cli::roundtrip
