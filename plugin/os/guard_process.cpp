#include "os/guard_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>
#include <vector>

#include "base/format.h"
#include "os/dir.h"
#include "os/proc.h"

namespace cuda_criu {
namespace {

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Closes every fd from first up; close_range (Linux 5.9) or, without it, each fd /proc lists.
void close_from(int first)
{
	if (syscall(SYS_close_range, first, ~0U, 0) == 0)
		return;
	std::vector<int> open_fds;
	if (auto d = Dir::open("/proc/self/fd")) {
		while (const char *name = d->next()) {
			int fd = std::atoi(name);
			if (fd >= first && fd != d->fd())
				open_fds.push_back(fd);
		}
	} else {
		rlimit rl{};
		int top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? static_cast<int>(rl.rlim_cur) : 65536;
		for (int fd = first; fd < top; fd++)
			open_fds.push_back(fd);
	}
	for (int fd : open_fds)
		close(fd);
}

// Moves fd out of the way (to 10 or above) before the fds are placed: CRIU may have started with 0, 1 or
// 2 closed, and then the socket, the pidfd or /dev/null sit where another is to go.
int lift(int fd) { return fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 10); }

// In the guard: its socket at 3, CRIU's pidfd at 4 (or nothing there), /dev/null at 0-2, no other fd.
void place_fds(int sock, int criu_pidfd)
{
	sock = lift(sock);
	criu_pidfd = lift(criu_pidfd);
	int null = lift(open("/dev/null", O_RDWR | O_CLOEXEC));
	dup2(sock, 3);
	if (criu_pidfd >= 0)
		dup2(criu_pidfd, 4);
	else
		close(4); // not CRIU's fd 4 left open in the guard
	for (int fd = 0; fd < 3; fd++)
		dup2(null, fd);
	close_from(5);
}

} // namespace

ProcRef ProcRef::of(pid_t pid) { return {pid, UniqueFd(pidfd_open(pid)), start_time_of(pid)}; }

bool ProcRef::exited() const
{
	if (!pidfd_.valid()) {
		auto st = read_task_status(pid_);
		if (!st || st->state == 'Z' || st->state == 'X')
			return true;
		return start_ && start_time_of(pid_) != start_; // the pid is another process's now
	}
	pollfd pf{pidfd_.get(), POLLIN, 0}; // a pidfd polls readable once the process has exited
	return poll(&pf, 1, 0) > 0;
}

void ProcRef::wait_exit() const
{
	if (pidfd_.valid()) {
		pollfd p{pidfd_.get(), POLLIN, 0};
		while (poll(&p, 1, -1) < 0 && errno == EINTR) {
		}
		return;
	}
	while (!exited())
		usleep(10000);
}

bool ProcRef::kill() const
{
	return (pidfd_.valid() ? syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0) : ::kill(pid_, SIGKILL)) == 0;
}

Result<UniqueFd> spawn_guard(const char *what, const std::function<void(int, const ProcRef &)> &body)
{
	int fds[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
		return errno_error("create the %s's socket", what);
	UniqueFd rd(fds[0]), wr(fds[1]);
	pid_t criu = getpid();
	UniqueFd criu_pidfd(pidfd_open(criu));
	uint64_t criu_start = start_time_of(criu);
	pid_t child = fork();
	if (child < 0)
		return errno_error("fork the %s", what);
	if (child == 0) {
		wr.reset();
		if (fork() != 0)
			_exit(0);
		setsid();
		bool has_pidfd = criu_pidfd.valid();
		place_fds(rd.get(), criu_pidfd.get());
		body(3, ProcRef(criu, UniqueFd(has_pidfd ? 4 : -1), criu_start));
		_exit(0);
	}
	while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
	}
	return wr;
}

bool read_guard_lines(int in, const ProcRef *until_exited, const std::function<void(const std::string &)> &on_line)
{
	int pidfd = until_exited ? until_exited->pidfd_.get() : -1;
	// Without a pidfd to poll, the process's exit is looked for every 100 ms.
	int timeout_ms = until_exited && pidfd < 0 ? 100 : -1;
	std::string pending;
	bool gone = false;
	for (;;) {
		pollfd p[2] = {{in, POLLIN, 0}, {pidfd, POLLIN, 0}};
		if (poll(p, pidfd >= 0 ? 2 : 1, timeout_ms) < 0 && errno != EINTR)
			break;
		gone = gone || (until_exited && until_exited->exited());
		char chunk[512];
		ssize_t n = recv(in, chunk, sizeof(chunk), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) || (n < 0 && gone))
			break;
		if (n < 0)
			continue;
		pending.append(chunk, static_cast<size_t>(n));
		size_t eol;
		while ((eol = pending.find('\n')) != std::string::npos) {
			on_line(pending.substr(0, eol));
			pending.erase(0, eol + 1);
		}
	}
	return gone;
}

void send_guard_line(int fd, const std::string &line)
{
	if (fd >= 0)
		(void)!send(fd, line.data(), line.size(), MSG_NOSIGNAL);
}

void guard_syslog(GuardLog level, const char *fmt, ...)
{
	static const bool opened = (openlog("cuda_plugin-guard", LOG_PID, LOG_DAEMON), true); // once, thread-safe
	(void)opened;
	va_list ap;
	va_start(ap, fmt);
	std::string text = vformat(fmt, ap);
	va_end(ap);
	syslog(level == GuardLog::Error ? LOG_ERR : LOG_WARNING, "%s", text.c_str());
}

} // namespace cuda_criu
