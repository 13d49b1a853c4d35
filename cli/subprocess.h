// Child processes: CRIU runs, the selftest workload. Programs are run by absolute path (execve, never a
// PATH search); every descriptor but the three standard ones is closed in the child, so that nothing
// this process holds (a driver's device files above all) leaks into a process CRIU will dump.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/result.h"

namespace cuda_criu::cli {

// Whether path is a regular file this process may execute.
bool is_executable_file(const std::string &path);

// The first DIR/name that is an executable file, DIR taken in turn from path_list (directories
// separated by ':', as in $PATH); "" when there is none. A relative entry (an empty one means ".")
// depends on the caller's working directory: skipped unless relative_ok.
std::string search_path(const std::string &name, const std::string &path_list, bool relative_ok = false);

struct SpawnOptions {
	std::vector<std::string> argv;    // argv[0] is the path executed
	std::vector<std::string> env_set; // "NAME=value", added to (or replacing in) this process's environment
	int stdin_fd = -1;                // -1: /dev/null
	int stdout_fd = -1;               // -1: /dev/null
	int stderr_fd = -1;               // -1: /dev/null
	bool new_session = false;         // setsid(): no controlling terminal, own process group
	std::string cwd;                  // empty: inherit
};

// A child this process started and owns: destroying a Child that still runs kills and reaps it.
class Child {
public:
	static Result<Child> spawn(const SpawnOptions &options);

	Child(Child &&other) noexcept;
	Child &operator=(Child &&other) noexcept;
	Child(const Child &) = delete;
	Child &operator=(const Child &) = delete;
	~Child();

	// Adopts pid, a child of this process (e.g. a restored task reparented to us as subreaper).
	static Child adopt(pid_t pid) { return Child(pid); }

	pid_t pid() const { return pid_; }
	bool running() const { return pid_ > 0; }
	// Waits up to timeout_ms (0: forever) for the child to end and returns its wait status; ETIMEDOUT
	// while it still runs.
	Result<int> wait(unsigned timeout_ms);
	// SIGKILL and reap; nothing when it has already ended.
	void kill_and_reap();

private:
	explicit Child(pid_t pid) : pid_(pid) {}
	pid_t pid_ = -1;
};

// "exited with status 3", "killed by signal 9 (Killed)".
std::string describe_wait_status(int status);

// Runs argv, waits up to timeout_ms, and returns what it wrote to stdout and stderr (interleaved, at
// most max_bytes). exit_status receives the wait status. env: "NAME=value" added to its environment.
Result<std::string> run_capture(const std::vector<std::string> &argv, unsigned timeout_ms, int &exit_status,
				size_t max_bytes = 64 * 1024, const std::vector<std::string> &env = {});

} // namespace cuda_criu::cli
