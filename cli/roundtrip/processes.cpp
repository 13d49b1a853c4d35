#include "roundtrip/processes.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>

#include "os/dir.h"
#include "os/proc.h"
#include "subprocess.h"
#include "roundtrip/signals.h"

namespace cuda_criu::cli::roundtrip {

std::vector<pid_t> tree_of(pid_t root)
{
	std::vector<pid_t> out;
	if (!process_exists(root))
		return out;
	std::set<pid_t> seen{root};
	out.push_back(root);
	for (size_t i = 0; i < out.size(); i++)
		for (pid_t c : children_of(out[i]))
			if (seen.insert(c).second)
				out.push_back(c);
	return out;
}

std::vector<pid_t> session_members(pid_t id)
{
	std::vector<pid_t> out;
	for (pid_t pid : proc_pids()) {
		std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
		std::string stat;
		std::getline(f, stat);
		// "PID (COMM) STATE PPID PGRP SESSION ...": COMM may hold anything, the last ')' ends it.
		size_t paren = stat.rfind(')');
		int pgrp = 0, session = 0;
		if (paren != std::string::npos &&
		    std::sscanf(stat.c_str() + paren + 1, " %*c %*d %d %d", &pgrp, &session) == 2 &&
		    (pgrp == id || session == id))
			out.push_back(pid);
	}
	return out;
}

bool is_zombie(pid_t pid)
{
	auto st = read_task_status(pid);
	return st && st->state == 'Z';
}

void reap_ended_children(pid_t keep)
{
	for (pid_t p : children_of(getpid()))
		if (p != keep && is_zombie(p))
			waitpid(p, nullptr, WNOHANG);
}

bool kill_descendants(unsigned timeout_ms, size_t &left)
{
	auto deadline = deadline_in(timeout_ms);
	for (;;) {
		std::vector<pid_t> all = tree_of(getpid());
		for (size_t i = 1; i < all.size(); i++)
			kill(all[i], SIGKILL);
		while (waitpid(-1, nullptr, WNOHANG) > 0)
			;
		if (all.size() <= 1 && waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD)
			return true;
		if (Clock::now() >= deadline) {
			left = all.size() - 1;
			return false;
		}
		pause_ms(kPollMs);
	}
}

Result<std::string> resolve_program(const std::string &name)
{
	if (name.find('/') != std::string::npos)
		return name;
	const char *path = std::getenv("PATH");
	std::string found = search_path(name, path ? path : "/usr/local/bin:/usr/bin:/bin", true);
	if (found.empty())
		return make_error(ENOENT, "%s: no such program in $PATH", name.c_str());
	return found;
}

Result<int> run_tool(const std::vector<std::string> &argv, const std::vector<std::string> &env, int out_fd,
		     unsigned timeout_ms, const std::function<void()> &while_running)
{
	SpawnOptions so;
	so.argv = argv;
	so.env_set = env;
	so.stdout_fd = so.stderr_fd = out_fd;
	auto child = Child::spawn(so);
	if (!child)
		return std::move(child).error();
	auto deadline = deadline_in(timeout_ms);
	for (;;) {
		auto st = child->wait(static_cast<unsigned>(kPollMs));
		if (st)
			return *st;
		if (st.error().errno_value() != ETIMEDOUT)
			return std::move(st).error();
		if (interrupted())
			return make_error(EINTR, "interrupted by %s (criu killed)", signal_name(caught_signal()).c_str());
		if (Clock::now() >= deadline)
			return make_error(ETIMEDOUT, "still running after %g s (killed)", timeout_ms / 1000.0);
		if (while_running)
			while_running();
	}
}

} // namespace cuda_criu::cli::roundtrip
