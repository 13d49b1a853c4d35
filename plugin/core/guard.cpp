#include "core/guard.h"

#include <fcntl.h>
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

// The guard's life, in the grandchild of CRIU (reparented away from it, so CRIU never waits for it).
[[noreturn]] void guard_main(int in, pid_t criu, const std::string &libcuda)
{
	setsid();
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	dup2(in, 3);
	for (int fd = 0; fd < 3; fd++)
		dup2(null, fd);
	syscall(SYS_close_range, 4, ~0U, 0); // nothing of CRIU's (image files, its log, runc's pipes)
	in = 3;

	struct Watched {
		pid_t pid;
		CudaState found;
	};
	std::vector<Watched> watched;
	FILE *f = fdopen(in, "r");
	char line[128];
	while (f && std::fgets(line, sizeof(line), f)) {
		if (line[0] == 'R')
			_exit(0);
		int pid = 0, state = 0;
		if (std::sscanf(line, "W %d %d", &pid, &state) == 2)
			watched.push_back({pid, static_cast<CudaState>(state)});
	}
	// CRIU is gone without a release. Its tracees are let go once it has fully exited.
	for (int i = 0; i < 500; i++) {
		auto st = read_task_status(criu);
		if (!st || st->state == 'Z' || st->state == 'X')
			break;
		usleep(10000);
	}
	openlog("cuda_plugin-guard", LOG_PID, LOG_DAEMON);
	auto driver = load_libcuda(libcuda);
	for (const Watched &w : watched) {
		if (!process_exists(w.pid))
			continue;
		if (!driver) {
			syslog(LOG_ERR, "CRIU (pid %d) died mid-dump; pid %d may be left locked: %s; run: cuda-criu resume %d",
			       criu, w.pid, driver.error().message().c_str(), w.pid);
			continue;
		}
		Status st;
		auto now = (*driver)->state(w.pid);
		if (now && *now == CudaState::Checkpointed && w.found != CudaState::Checkpointed)
			st = (*driver)->restore(w.pid, {});
		if (st && now && *now != CudaState::Running && w.found == CudaState::Running)
			st = (*driver)->unlock(w.pid);
		if (!st || !now)
			syslog(LOG_ERR, "CRIU (pid %d) died mid-dump; could not return pid %d to %s: %s; run: cuda-criu resume %d",
			       criu, w.pid, to_string(w.found), (st ? now.error() : st.error()).message().c_str(), w.pid);
		else
			syslog(LOG_WARNING, "CRIU (pid %d) died mid-dump; pid %d returned to %s", criu, w.pid, to_string(w.found));
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
	pid_t child = fork();
	if (child < 0)
		return errno_error("%s", "fork the dump guard");
	if (child == 0) {
		wr.reset();
		if (fork() == 0)
			guard_main(rd.get(), criu, libcuda);
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

void DumpGuard::release()
{
	if (!pipe_.valid())
		return;
	(void)!send(pipe_.get(), "R\n", 2, MSG_NOSIGNAL);
	pipe_.reset();
}

} // namespace cuda_criu
