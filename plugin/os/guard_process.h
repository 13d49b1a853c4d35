// The mechanism of the guards (core/guard.h says what they decide): a grandchild forked away from CRIU
// with only the fds it needs, processes known by pidfd (or by pid and start time), the lines of the
// guard's socket, and syslog, the one place a guard can say what it did.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

#include "base/result.h"
#include "os/unique_fd.h"

namespace cuda_criu {

// A process as a guard knows it: by pidfd, or on kernels without pidfds by pid and start time, so that
// a later process given the same pid is not taken for it. Move-only: it owns the pidfd.
class ProcRef {
public:
	// The process that has pid now.
	static ProcRef of(pid_t pid);

	ProcRef() = default;
	pid_t pid() const { return pid_; }
	// Whether the process has exited (or its pid is another process's now).
	bool exited() const;
	// Blocks until the process has exited.
	void wait_exit() const;
	// SIGKILL, through the pidfd where there is one; false (errno set) when it cannot be sent.
	bool kill() const;

private:
	friend Result<UniqueFd> spawn_guard(const char *what, const std::function<void(int, const ProcRef &)> &body);
	friend bool read_guard_lines(int in, const ProcRef *until_exited,
				     const std::function<void(const std::string &)> &on_line);
	ProcRef(pid_t pid, UniqueFd pidfd, uint64_t start) : pid_(pid), pidfd_(std::move(pidfd)), start_(start) {}
	pid_t pid_ = 0;
	UniqueFd pidfd_;
	uint64_t start_ = 0; // 0: unknown
};

// Forks body as a grandchild of this process (reparented away from it, so CRIU never waits for it), in
// a session of its own: its socket at fd 3 (the `in` body gets), this process's pidfd at 4 (or nothing
// there), /dev/null at 0-2 and no other fd (nothing of CRIU's: image files, its log, runc's pipes). The
// body gets this process as `parent`. Returns the other end of the socket; what names the guard in errors.
Result<UniqueFd> spawn_guard(const char *what, const std::function<void(int in, const ProcRef &parent)> &body);

// Calls on_line for each line (without its newline) read from the socket in, until its writers close it,
// or, with until_exited, once that process has exited and nothing is left to read (a helper CRIU forked
// may still hold the socket). Returns whether until_exited had exited.
bool read_guard_lines(int in, const ProcRef *until_exited, const std::function<void(const std::string &)> &on_line);

// Sends line to a guard's socket; a guard that is gone is no error (and must not kill CRIU with SIGPIPE).
void send_guard_line(int fd, const std::string &line);

// A line to syslog as cuda_plugin-guard[PID].
enum class GuardLog { Warning, Error };
void guard_syslog(GuardLog level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

} // namespace cuda_criu
