#include "subprocess.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "base/format.h"
#include "os/unique_fd.h"

namespace cuda_criu::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> merged_environment(const std::vector<std::string> &overrides)
{
	std::vector<std::string> env;
	for (char **e = environ; e && *e; e++) {
		std::string entry = *e;
		std::string name = entry.substr(0, entry.find('='));
		bool replaced = false;
		for (const auto &o : overrides)
			replaced |= o.substr(0, o.find('=')) == name;
		if (!replaced)
			env.push_back(std::move(entry));
	}
	env.insert(env.end(), overrides.begin(), overrides.end());
	return env;
}

std::vector<char *> c_strings(std::vector<std::string> &strings)
{
	std::vector<char *> out;
	out.reserve(strings.size() + 1);
	for (auto &s : strings)
		out.push_back(s.data());
	out.push_back(nullptr);
	return out;
}

void sleep_ms(long ms)
{
	timespec ts{ms / 1000, (ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

} // namespace

bool is_executable_file(const std::string &path)
{
	struct stat st = {};
	return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string search_path(const std::string &name, const std::string &path_list, bool relative_ok)
{
	for (size_t start = 0; start <= path_list.size();) {
		size_t colon = path_list.find(':', start);
		std::string dir = path_list.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
		start = colon == std::string::npos ? path_list.size() + 1 : colon + 1;
		if (!relative_ok && (dir.empty() || dir[0] != '/'))
			continue;
		std::string file = format("%s/%s", dir.empty() ? "." : dir.c_str(), name.c_str());
		if (is_executable_file(file))
			return file;
	}
	return "";
}

Result<Child> Child::spawn(const SpawnOptions &options)
{
	if (options.argv.empty())
		return make_error(EINVAL, "spawn: no program given");
	// Everything the child needs is prepared here: between fork and exec only async-signal-safe calls.
	std::vector<std::string> argv_strings = options.argv;
	std::vector<std::string> env_strings = merged_environment(options.env_set);
	std::vector<char *> argv = c_strings(argv_strings);
	std::vector<char *> envp = c_strings(env_strings);
	const char *cwd = options.cwd.empty() ? nullptr : options.cwd.c_str();
	long max_fd = sysconf(_SC_OPEN_MAX);
	if (max_fd < 0 || max_fd > 65536)
		max_fd = 65536;

	UniqueFd devnull(open("/dev/null", O_RDWR | O_CLOEXEC));
	if (!devnull.valid())
		return errno_error("open /dev/null");
	const int std_fds[3] = {options.stdin_fd >= 0 ? options.stdin_fd : devnull.get(),
				options.stdout_fd >= 0 ? options.stdout_fd : devnull.get(),
				options.stderr_fd >= 0 ? options.stderr_fd : devnull.get()};
	// The child reports a failed exec through this pipe; a successful exec closes it (close-on-exec).
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		return errno_error("pipe2");
	UniqueFd err_read(p[0]), err_write(p[1]);

	pid_t pid = fork();
	if (pid < 0)
		return errno_error("fork to run %s", options.argv[0].c_str());
	if (pid == 0) {
		if (options.new_session)
			setsid();
		// Copies above 2 first, so that a source that is itself 0, 1 or 2 is not overwritten early.
		int high[3];
		for (int i = 0; i < 3; i++)
			high[i] = fcntl(std_fds[i], F_DUPFD_CLOEXEC, 3);
		for (int i = 0; i < 3; i++)
			if (high[i] < 0 || dup2(high[i], i) < 0)
				_exit(127);
		if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
			for (int fd = 3; fd < max_fd; fd++)
				fcntl(fd, F_SETFD, FD_CLOEXEC);
		int err = 0;
		if (cwd && chdir(cwd) != 0)
			err = errno;
		else {
			execve(argv[0], argv.data(), envp.data());
			err = errno;
		}
		ssize_t ignored = write(err_write.get(), &err, sizeof(err));
		(void)ignored;
		_exit(127);
	}
	err_write.reset();
	Child child(pid);
	int err = 0;
	ssize_t n;
	while ((n = read(err_read.get(), &err, sizeof(err))) < 0 && errno == EINTR)
		;
	if (n == static_cast<ssize_t>(sizeof(err))) {
		child.kill_and_reap();
		return make_error(err, "cannot run %s: %s%s", options.argv[0].c_str(), errno_string(err).c_str(),
				  cwd ? format(" (working directory %s)", cwd).c_str() : "");
	}
	return child;
}

Child::Child(Child &&other) noexcept : pid_(other.pid_) { other.pid_ = -1; }

Child &Child::operator=(Child &&other) noexcept
{
	if (this != &other) {
		kill_and_reap();
		pid_ = other.pid_;
		other.pid_ = -1;
	}
	return *this;
}

Child::~Child() { kill_and_reap(); }

Result<int> Child::wait(unsigned timeout_ms)
{
	if (pid_ <= 0)
		return make_error(ECHILD, "wait: no child");
	auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
	long pause_ms = 1;
	for (;;) {
		int status = 0;
		pid_t r = waitpid(pid_, &status, WNOHANG);
		if (r == pid_) {
			pid_ = -1;
			return status;
		}
		if (r < 0 && errno != EINTR)
			return errno_error("waitpid %d", pid_);
		if (timeout_ms && Clock::now() >= deadline)
			return make_error(ETIMEDOUT, "pid %d still runs after %.1f s", pid_, timeout_ms / 1000.0);
		sleep_ms(pause_ms);
		pause_ms = pause_ms < 50 ? pause_ms * 2 : 50;
	}
}

void Child::kill_and_reap()
{
	if (pid_ <= 0)
		return;
	kill(pid_, SIGKILL);
	while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR)
		;
	pid_ = -1;
}

std::string describe_wait_status(int status)
{
	if (WIFEXITED(status))
		return format("exited with status %d", WEXITSTATUS(status));
	if (WIFSIGNALED(status))
		return format("killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
	return format("ended with wait status %#x", status);
}

Result<std::string> run_capture(const std::vector<std::string> &argv, unsigned timeout_ms, int &exit_status,
				size_t max_bytes, const std::vector<std::string> &env)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0)
		return errno_error("pipe2");
	UniqueFd out_read(p[0]), out_write(p[1]);
	SpawnOptions so;
	so.argv = argv;
	so.env_set = env;
	so.stdout_fd = so.stderr_fd = out_write.get();
	auto child = Child::spawn(so);
	if (!child)
		return std::move(child).error();
	out_write.reset();

	std::string out;
	auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
	for (;;) {
		auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
		if (left <= 0)
			return make_error(ETIMEDOUT, "%s gave no answer within %.1f s", argv[0].c_str(), timeout_ms / 1000.0);
		pollfd pfd{out_read.get(), POLLIN, 0};
		int r = poll(&pfd, 1, static_cast<int>(left));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return errno_error("poll");
		if (r == 0)
			continue;
		char buf[4096];
		ssize_t n = read(out_read.get(), buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (out.size() < max_bytes)
			out.append(buf, std::min(static_cast<size_t>(n), max_bytes - out.size()));
	}
	auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
	auto st = child->wait(left > 0 ? static_cast<unsigned>(left) : 1);
	if (!st)
		return std::move(st).error().context("%s", argv[0].c_str());
	exit_status = *st;
	return out;
}

} // namespace cuda_criu::cli
