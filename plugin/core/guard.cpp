#include "core/guard.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "base/format.h"
#include "core/parallel.h"
#include "os/guard_process.h"

namespace cuda_criu {
namespace {

struct Watched {
	pid_t pid;
	ProcRef ref; // the process itself, not a later one with the same pid
	CudaState found;
};

void dump_guard_main(int in, const ProcRef &criu_ref, const DriverSource &driver_source, unsigned timeout_ms)
{
	std::vector<std::shared_ptr<const Watched>> watched; // shared with the jobs, which may be abandoned
	std::vector<pid_t> returned; // by the plugin itself: nothing to check (a stopped one cannot answer)
	read_guard_lines(in, nullptr, [&watched, &returned](const std::string &line) {
		int pid = 0, state = 0;
		if (std::sscanf(line.c_str(), "W %d %d", &pid, &state) == 2)
			watched.push_back(
				std::make_shared<const Watched>(Watched{pid, ProcRef::of(pid), static_cast<CudaState>(state)}));
		else if (std::sscanf(line.c_str(), "D %d", &pid) == 1)
			returned.push_back(pid);
	});
	watched.erase(std::remove_if(watched.begin(), watched.end(),
				     [&returned](const auto &w) {
					     return std::find(returned.begin(), returned.end(), w->pid) != returned.end();
				     }),
		      watched.end());
	// The plugin is done with CRIU's run (or CRIU died). Once CRIU has fully exited, every watched process
	// still alive must be in the state it was found in. It is after a normal dump (killed), after
	// --leave-running or a failed dump (the plugin returned it); it is not when CRIU died mid-dump, or let
	// the tasks go after a successful dump (a post-dump script said so).
	criu_ref.wait_exit();
	pid_t criu = criu_ref.pid();
	bool any_alive = false;
	for (const auto &w : watched)
		any_alive |= !w->ref.exited();
	if (!any_alive)
		return;
	auto driver = driver_source();
	std::vector<Job> jobs;
	std::vector<pid_t> pids;
	for (const auto &w : watched) {
		if (w->ref.exited())
			continue;
		if (!driver) {
			guard_syslog(GuardLog::Error,
				     "CRIU (pid %d) has exited; pid %d may be left locked: %s; run: cuda-criu resume %d", criu,
				     w->pid, driver.error().message().c_str(), w->pid);
			continue;
		}
		Driver *d = *driver;
		pids.push_back(w->pid);
		jobs.push_back({format("CRIU (pid %d) has exited; return pid %d to %s", criu, w->pid, to_string(w->found)),
				[d, w, criu, timeout_ms]() -> Status {
					auto out = return_to_found(*d, w->pid, w->found, [&w] { return w->ref.exited(); },
								   timeout_ms);
					if (!out)
						return std::move(out).error();
					// Said only of what the guard did: a process back by CRIU's own last call is not.
					if (out->now == w->found && out->acted)
						guard_syslog(GuardLog::Warning, "CRIU (pid %d) left pid %d %s; returned it to %s",
							     criu, w->pid, to_string(out->left), to_string(w->found));
					else if (out->now != w->found)
						guard_syslog(GuardLog::Warning,
							     "CRIU (pid %d) has exited; pid %d, found %s, is %s: the guard cannot "
							     "bring it back from there and left it as it is%s",
							     criu, w->pid, to_string(w->found), to_string(out->now),
							     out->now == CudaState::Running
								     ? format(" (run: cuda-criu lock %d to lock it again)", w->pid).c_str()
								     : "");
					return {};
				}});
	}
	// A driver call that does not return is abandoned (it dies with this process): the guard never hangs.
	std::vector<Status> results = run_jobs(std::move(jobs), 0, timeout_ms);
	for (size_t i = 0; i < results.size(); i++)
		if (!results[i])
			guard_syslog(GuardLog::Error, "%s; run: cuda-criu resume %d", results[i].error().message().c_str(),
				     pids[i]);
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
	std::vector<Restoring> procs;
	bool criu_gone = read_guard_lines(in, &criu_ref, [&procs](const std::string &line) {
		char kind = 0;
		int pid = 0;
		if (std::sscanf(line.c_str(), "%c %d", &kind, &pid) != 2)
			return;
		if (kind == 'R')
			procs.push_back({pid, ProcRef::of(pid), false});
		else if (kind == 'D')
			for (Restoring &r : procs)
				r.done |= r.pid == pid;
	});
	// Killed at once, even when CRIU has killed them already (a failed restore) and they are still exiting:
	// a restored process must not run a moment longer without its GPU state.
	std::string killed, failed;
	int kill_errno = 0;
	for (const Restoring &r : procs) {
		if (r.done || r.ref.exited())
			continue;
		bool ok = r.ref.kill();
		if (!ok)
			kill_errno = errno;
		(ok ? killed : failed) += format("%s%d", (ok ? killed : failed).empty() ? "" : ", ", r.pid);
	}
	pid_t criu = criu_ref.pid();
	const char *how = criu_gone ? "exited" : "finished";
	if (!killed.empty())
		guard_syslog(GuardLog::Warning,
			     "CRIU (pid %d) %s without the GPU state of pid(s) %s restored; killed them so that none runs "
			     "without its GPU state",
			     criu, how, killed.c_str());
	if (!failed.empty())
		guard_syslog(GuardLog::Error,
			     "CRIU (pid %d) %s without the GPU state of pid(s) %s restored, and they cannot be killed "
			     "(%s): kill them",
			     criu, how, failed.c_str(), std::strerror(kill_errno));
}

} // namespace

Result<ReturnOutcome> return_to_found(Driver &d, pid_t pid, CudaState found, const std::function<bool()> &gone,
				      unsigned timeout_ms, unsigned pause_ms)
{
	const int attempts = std::max(50, static_cast<int>(timeout_ms / 100));
	std::optional<CudaState> left;
	bool acted = false;
	for (int attempt = 1;; attempt++) {
		if (gone())
			return ReturnOutcome{found, found, false}; // its pid may be another process's: nothing to touch
		auto now = d.state(pid);
		if (!now)
			return std::move(now).error().context("%s", "read its CUDA state");
		if (!left)
			left = *now;
		// A restore takes it from checkpointed to locked, an unlock from locked to running; nothing takes
		// it from running to locked (the guard does not lock what it did not lock) or out of failed.
		bool reachable = *now == CudaState::Checkpointed || (*now == CudaState::Locked && found == CudaState::Running);
		if (*now == found || !reachable)
			return ReturnOutcome{*left, *now, acted};
		Status st;
		if (*now == CudaState::Checkpointed) {
			st = d.restore(pid, {});
			acted |= st.ok();
		}
		if (st && found == CudaState::Running) {
			st = d.unlock(pid);
			acted |= st.ok();
		}
		if (st)
			return ReturnOutcome{*left, found, true};
		if (attempt == attempts)
			return std::move(st).error().context("it was left %s", to_string(*left));
		usleep(pause_ms * 1000);
	}
}

Result<DumpGuard> DumpGuard::start(DriverSource driver, unsigned timeout_ms)
{
	auto fd = spawn_guard("dump guard", [&driver, timeout_ms](int in, const ProcRef &criu) {
		dump_guard_main(in, criu, driver, timeout_ms);
	});
	if (!fd)
		return std::move(fd).error();
	return DumpGuard(std::move(*fd));
}

void DumpGuard::watch(pid_t pid, CudaState found)
{
	send_guard_line(pipe_.get(), format("W %d %d\n", pid, static_cast<int>(found)));
}

void DumpGuard::returned(pid_t pid) { send_guard_line(pipe_.get(), format("D %d\n", pid)); }

Result<RestoreGuard> RestoreGuard::start()
{
	auto fd = spawn_guard("restore guard", restore_guard_main);
	if (!fd)
		return std::move(fd).error();
	return RestoreGuard(std::move(*fd));
}

void RestoreGuard::restoring(pid_t pid) { send_line('R', pid); }

void RestoreGuard::restored(pid_t pid) { send_line('D', pid); }

void RestoreGuard::send_line(char kind, pid_t pid)
{
	send_guard_line(pipe_.get(), format("%c %d\n", kind, pid));
}

} // namespace cuda_criu
