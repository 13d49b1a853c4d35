#include "core/guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "driver/libcuda.h"
#include "os/proc.h"

namespace cuda_criu {
namespace {

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Whether the process behind a pidfd has exited (a pidfd polls readable then). Without a pidfd (old
// kernels), whether /proc has it.
bool exited(int pidfd, pid_t pid)
{
	if (pidfd < 0)
		return !process_exists(pid);
	pollfd p{pidfd, POLLIN, 0};
	return poll(&p, 1, 0) > 0;
}

// The guard's life, in the grandchild of CRIU (reparented away from it, so CRIU never waits for it).
[[noreturn]] void guard_main(int in, pid_t criu, int criu_pidfd, const std::string &libcuda)
{
	setsid();
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	dup2(in, 3);
	dup2(criu_pidfd, 4);
	for (int fd = 0; fd < 3; fd++)
		dup2(null, fd);
	syscall(SYS_close_range, 5, ~0U, 0); // nothing of CRIU's (image files, its log, runc's pipes)
	in = 3;
	criu_pidfd = criu_pidfd >= 0 ? 4 : -1;

	struct Watched {
		pid_t pid;
		int pidfd; // the process itself, not a later one with the same pid
		CudaState found;
	};
	std::vector<Watched> watched;
	FILE *f = fdopen(in, "r");
	char line[128];
	while (f && std::fgets(line, sizeof(line), f)) {
		int pid = 0, state = 0;
		if (std::sscanf(line, "W %d %d", &pid, &state) == 2)
			watched.push_back({pid, pidfd_open(pid), static_cast<CudaState>(state)});
	}
	// The plugin is done with CRIU's run (or CRIU died). Once CRIU has fully exited, its tracees are let
	// go: every watched process still alive must be in the state it was found in. It is after a normal
	// dump (killed), after --leave-running or a failed dump (the plugin returned it); it is not when CRIU
	// died mid-dump, or let the tasks go after a successful dump (a post-dump script said so).
	if (criu_pidfd >= 0) {
		pollfd p{criu_pidfd, POLLIN, 0};
		while (poll(&p, 1, -1) < 0 && errno == EINTR) {
		}
	} else {
		for (;;) {
			auto st = read_task_status(criu);
			if (!st || st->state == 'Z' || st->state == 'X')
				break;
			usleep(10000);
		}
	}
	bool any_alive = false;
	for (const Watched &w : watched)
		any_alive |= !exited(w.pidfd, w.pid);
	if (!any_alive)
		_exit(0);
	openlog("cuda_plugin-guard", LOG_PID, LOG_DAEMON);
	auto driver = load_libcuda(libcuda);
	for (const Watched &w : watched) {
		if (exited(w.pidfd, w.pid))
			continue;
		if (!driver) {
			syslog(LOG_ERR, "CRIU (pid %d) has exited; pid %d may be left locked: %s; run: cuda-criu resume %d",
			       criu, w.pid, driver.error().message().c_str(), w.pid);
			continue;
		}
		auto now = (*driver)->state(w.pid);
		if (!now) {
			syslog(LOG_ERR, "CRIU (pid %d) has exited; cannot read the CUDA state of pid %d: %s", criu, w.pid,
			       now.error().message().c_str());
			continue;
		}
		if (*now == w.found)
			continue;
		Status st;
		if (*now == CudaState::Checkpointed)
			st = (*driver)->restore(w.pid, {});
		if (st && w.found == CudaState::Running)
			st = (*driver)->unlock(w.pid);
		if (!st)
			syslog(LOG_ERR, "CRIU (pid %d) left pid %d %s; could not return it to %s: %s; run: cuda-criu resume %d",
			       criu, w.pid, to_string(*now), to_string(w.found), st.error().message().c_str(), w.pid);
		else
			syslog(LOG_WARNING, "CRIU (pid %d) left pid %d %s; returned it to %s", criu, w.pid, to_string(*now),
			       to_string(w.found));
	}
	_exit(0);
}

} // namespace

Result<DumpGuard> DumpGuard::start(const std::string &libcuda)
{
	int fds[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
		return errno_error("%s", "create the dump guard's socket");
	UniqueFd rd(fds[0]), wr(fds[1]);
	pid_t criu = getpid();
	UniqueFd criu_pidfd(pidfd_open(criu));
	pid_t child = fork();
	if (child < 0)
		return errno_error("%s", "fork the dump guard");
	if (child == 0) {
		wr.reset();
		if (fork() == 0)
			guard_main(rd.get(), criu, criu_pidfd.get(), libcuda);
		_exit(0);
	}
	while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
	}
	return DumpGuard(std::move(wr));
}

void DumpGuard::watch(pid_t pid, CudaState found)
{
	if (!pipe_.valid())
		return;
	char msg[64];
	int n = std::snprintf(msg, sizeof(msg), "W %d %d\n", pid, static_cast<int>(found));
	(void)!send(pipe_.get(), msg, static_cast<size_t>(n), MSG_NOSIGNAL); // a dead guard must not kill CRIU
}


} // namespace cuda_criu
