#include "core/guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

#include "base/format.h"
#include "core/parallel.h"
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

// A process as a guard knows it: by pidfd, or on kernels without pidfds by pid and start time, so that
// a later process given the same pid is not taken for it. Move-only: it owns the pidfd.
struct ProcRef {
	pid_t pid = 0;
	UniqueFd pidfd;
	uint64_t start = 0; // 0: unknown
};

ProcRef ref_of(pid_t pid) { return {pid, UniqueFd(pidfd_open(pid)), start_time_of(pid)}; }

// Whether the process has exited (a pidfd polls readable then).
bool exited(const ProcRef &p)
{
	if (!p.pidfd.valid()) {
		auto st = read_task_status(p.pid);
		if (!st || st->state == 'Z' || st->state == 'X')
			return true;
		return p.start && start_time_of(p.pid) != p.start; // the pid is another process's now
	}
	pollfd pf{p.pidfd.get(), POLLIN, 0};
	return poll(&pf, 1, 0) > 0;
}

// The guard's body, in the grandchild of CRIU: in is the socket the plugin writes to.
using GuardMain = std::function<void(int in, const ProcRef &criu)>;

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
	close_from(5); // nothing of CRIU's (image files, its log, runc's pipes)
}

// Forks the guard as a grandchild of this process (reparented away from it, so CRIU never waits for it)
// and returns the socket to talk to it.
Result<UniqueFd> spawn(const char *what, const GuardMain &body)
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
		body(3, ProcRef{criu, UniqueFd(has_pidfd ? 4 : -1), criu_start});
		_exit(0);
	}
	while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
	}
	return wr;
}

// Waits until CRIU has fully exited (its tracees are let go).
void wait_for_exit(const ProcRef &criu)
{
	if (criu.pidfd.valid()) {
		pollfd p{criu.pidfd.get(), POLLIN, 0};
		while (poll(&p, 1, -1) < 0 && errno == EINTR) {
		}
		return;
	}
	while (!exited(criu))
		usleep(10000);
}

struct Watched {
	pid_t pid;
	ProcRef ref; // the process itself, not a later one with the same pid
	CudaState found;
};

void dump_guard_main(int in, const ProcRef &criu_ref, const DriverSource &driver_source, unsigned timeout_ms)
{
	std::vector<std::shared_ptr<const Watched>> watched; // shared with the jobs, which may be abandoned
	FILE *f = fdopen(in, "r");
	char line[128];
	while (f && std::fgets(line, sizeof(line), f)) {
		int pid = 0, state = 0;
		if (std::sscanf(line, "W %d %d", &pid, &state) == 2)
			watched.push_back(std::make_shared<const Watched>(Watched{pid, ref_of(pid), static_cast<CudaState>(state)}));
	}
	// The plugin is done with CRIU's run (or CRIU died). Once CRIU has fully exited, every watched process
	// still alive must be in the state it was found in. It is after a normal dump (killed), after
	// --leave-running or a failed dump (the plugin returned it); it is not when CRIU died mid-dump, or let
	// the tasks go after a successful dump (a post-dump script said so).
	wait_for_exit(criu_ref);
	pid_t criu = criu_ref.pid;
	bool any_alive = false;
	for (const auto &w : watched)
		any_alive |= !exited(w->ref);
	if (!any_alive)
		return;
	openlog("cuda_plugin-guard", LOG_PID, LOG_DAEMON);
	auto driver = driver_source();
	std::vector<Job> jobs;
	std::vector<pid_t> pids;
	for (const auto &w : watched) {
		if (exited(w->ref))
			continue;
		if (!driver) {
			syslog(LOG_ERR, "CRIU (pid %d) has exited; pid %d may be left locked: %s; run: cuda-criu resume %d",
			       criu, w->pid, driver.error().message().c_str(), w->pid);
			continue;
		}
		Driver *d = *driver;
		pids.push_back(w->pid);
		jobs.push_back({format("CRIU (pid %d) has exited; return pid %d to %s", criu, w->pid, to_string(w->found)),
				[d, w, criu, timeout_ms]() -> Status {
					auto left = return_to_found(*d, w->pid, w->found, [&w] { return exited(w->ref); },
								    timeout_ms);
					if (!left)
						return std::move(left).error();
					if (*left != w->found)
						syslog(LOG_WARNING, "CRIU (pid %d) left pid %d %s; returned it to %s", criu,
						       w->pid, to_string(*left), to_string(w->found));
					return {};
				}});
	}
	// A driver call that does not return is abandoned (it dies with this process): the guard never hangs.
	std::vector<Status> results = run_jobs(std::move(jobs), 0, timeout_ms);
	for (size_t i = 0; i < results.size(); i++)
		if (!results[i])
			syslog(LOG_ERR, "%s; run: cuda-criu resume %d", results[i].error().message().c_str(), pids[i]);
}

// Reads "R pid" (being restored) and "D pid" (restored) lines until the plugin closes the socket or CRIU
// exits, then kills every process being restored that is not restored.
void restore_guard_main(int in, const ProcRef &criu_ref)
{
	struct Restoring {
		pid_t pid;
		ProcRef ref;
		bool done;
	};
	pid_t criu = criu_ref.pid;
	int criu_pidfd = criu_ref.pidfd.get();
	std::vector<Restoring> procs;
	std::string pending;
	bool criu_gone = false;
	for (;;) {
		pollfd p[2] = {{in, POLLIN, 0}, {criu_pidfd, POLLIN, 0}};
		if (poll(p, criu_pidfd >= 0 ? 2 : 1, criu_pidfd >= 0 ? -1 : 100) < 0 && errno != EINTR)
			break;
		// A helper forked by CRIU may still hold the socket: CRIU's exit ends the run too.
		criu_gone = criu_gone || exited(criu_ref);
		char chunk[512];
		ssize_t n = recv(in, chunk, sizeof(chunk), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) || (n < 0 && criu_gone))
			break;
		if (n < 0)
			continue;
		pending.append(chunk, static_cast<size_t>(n));
		size_t eol;
		while ((eol = pending.find('\n')) != std::string::npos) {
			char kind = 0;
			int pid = 0;
			if (std::sscanf(pending.c_str(), "%c %d", &kind, &pid) == 2) {
				if (kind == 'R')
					procs.push_back({pid, ref_of(pid), false});
				else if (kind == 'D')
					for (Restoring &r : procs)
						r.done |= r.pid == pid;
			}
			pending.erase(0, eol + 1);
		}
	}
	// Killed at once, even when CRIU has killed them already (a failed restore) and they are still exiting:
	// a restored process must not run a moment longer without its GPU state.
	std::string killed, failed;
	for (const Restoring &r : procs) {
		if (r.done || exited(r.ref))
			continue;
		bool ok = (r.ref.pidfd.valid() ? syscall(SYS_pidfd_send_signal, r.ref.pidfd.get(), SIGKILL, nullptr, 0)
					: kill(r.pid, SIGKILL)) == 0;
		(ok ? killed : failed) += format("%s%d", (ok ? killed : failed).empty() ? "" : ", ", r.pid);
	}
	if (killed.empty() && failed.empty())
		return;
	openlog("cuda_plugin-guard", LOG_PID, LOG_DAEMON);
	const char *how = criu_gone ? "exited" : "finished";
	if (!killed.empty())
		syslog(LOG_WARNING,
		       "CRIU (pid %d) %s without the GPU state of pid(s) %s restored; killed them so that none runs "
		       "without its GPU state",
		       criu, how, killed.c_str());
	if (!failed.empty())
		syslog(LOG_ERR,
		       "CRIU (pid %d) %s without the GPU state of pid(s) %s restored, and they cannot be killed (%s): "
		       "kill them",
		       criu, how, failed.c_str(), std::strerror(errno));
}

} // namespace

Result<CudaState> return_to_found(Driver &d, pid_t pid, CudaState found, const std::function<bool()> &gone,
				  unsigned timeout_ms, unsigned pause_ms)
{
	const int attempts = std::max(50, static_cast<int>(timeout_ms / 100));
	std::optional<CudaState> left;
	for (int attempt = 1;; attempt++) {
		if (gone())
			return found; // its pid may be another process's: nothing to touch, nothing to report
		auto now = d.state(pid);
		if (!now)
			return std::move(now).error().context("%s", "read its CUDA state");
		if (!left)
			left = *now;
		if (*now == found)
			return *left;
		Status st;
		if (*now == CudaState::Checkpointed)
			st = d.restore(pid, {});
		if (st && found == CudaState::Running)
			st = d.unlock(pid);
		if (st)
			return *left;
		if (attempt == attempts)
			return std::move(st).error().context("it was left %s", to_string(*left));
		usleep(pause_ms * 1000);
	}
}

Result<DumpGuard> DumpGuard::start(DriverSource driver, unsigned timeout_ms)
{
	auto fd = spawn("dump guard", [&driver, timeout_ms](int in, const ProcRef &criu) {
		dump_guard_main(in, criu, driver, timeout_ms);
	});
	if (!fd)
		return std::move(fd).error();
	return DumpGuard(std::move(*fd));
}

void DumpGuard::watch(pid_t pid, CudaState found)
{
	if (!pipe_.valid())
		return;
	char msg[64];
	int n = std::snprintf(msg, sizeof(msg), "W %d %d\n", pid, static_cast<int>(found));
	(void)!send(pipe_.get(), msg, static_cast<size_t>(n), MSG_NOSIGNAL); // a dead guard must not kill CRIU
}

Result<RestoreGuard> RestoreGuard::start()
{
	auto fd = spawn("restore guard", restore_guard_main);
	if (!fd)
		return std::move(fd).error();
	return RestoreGuard(std::move(*fd));
}

void RestoreGuard::restoring(pid_t pid) { send_line('R', pid); }

void RestoreGuard::restored(pid_t pid) { send_line('D', pid); }

void RestoreGuard::send_line(char kind, pid_t pid)
{
	if (!pipe_.valid())
		return;
	char msg[32];
	int n = std::snprintf(msg, sizeof(msg), "%c %d\n", kind, pid);
	(void)!send(pipe_.get(), msg, static_cast<size_t>(n), MSG_NOSIGNAL);
}

} // namespace cuda_criu
