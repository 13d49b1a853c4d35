// cuda-criu roundtrip: a user's program, started in its own session, dumped with CRIU and our plugin,
// restored, and checked to be healthy again, N times; each step timed and reported as a table, JSON and
// JUnit XML. Everything it starts and creates is removed at the end, also when it is interrupted.
//
// Processes: this program makes itself a child subreaper, so that everything the program forks, and
// everything `criu restore -d` brings back, ends up as its descendant; the cleanup kills its descendants
// and reaps them. Pids are only ever signalled while they are known to be unreaped (a Child, or a process
// just found in /proc as a descendant).
#include "roundtrip.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <regex.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "criu_info.h"
#include "elf_file.h"
#include "image/image.h"
#include "json.h"
#include "os/proc.h"
#include "os/unique_fd.h"
#include "subprocess.h"

namespace cuda_criu::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr unsigned kDefaultStartMs = 120 * 1000;
constexpr unsigned kDefaultDumpMs = 600 * 1000;
constexpr unsigned kDefaultRestoreMs = 600 * 1000;
constexpr unsigned kDefaultHealthMs = 60 * 1000;
constexpr unsigned kDefaultSettleMs = 1000;
constexpr unsigned kCleanupMs = 30 * 1000;
constexpr unsigned kVersionMs = 10 * 1000;
constexpr long kPollMs = 20;
constexpr long kHealthRetryMs = 250;
constexpr size_t kExplainLines = 20;
constexpr size_t kMaxLineBytes = 500;
constexpr off_t kMaxLogTail = 8 << 20; // of a CRIU log, only the end is read for an excerpt

// ---- signals ----

volatile std::sig_atomic_t g_signal = 0;

void on_signal(int signo) { g_signal = signo; }

void on_sigpipe(int /*signo*/) {}

bool interrupted() { return g_signal != 0; }

// SIGINT, SIGTERM and SIGHUP only set a flag: every wait below polls it, stops, and the cleanup runs.
// A signal ignored on entry (SIGINT of a background job) stays ignored. SIGPIPE does nothing: a reader of
// the table that goes away (`| head`) must not end this program before its cleanup.
class SignalHandlers {
public:
	SignalHandlers()
	{
		struct sigaction sa = {};
		sa.sa_handler = on_signal;
		sigemptyset(&sa.sa_mask);
		// No SA_RESTART: a sleep in progress ends early and the loop around it sees the flag.
		for (size_t i = 0; i < kSignals.size(); i++) {
			sigaction(kSignals[i], &sa, &old_[i]);
			if (old_[i].sa_handler == SIG_IGN)
				sigaction(kSignals[i], &old_[i], nullptr);
		}
		// A handler, not SIG_IGN: an ignored signal would stay ignored in the programs started here.
		struct sigaction pipe = {};
		pipe.sa_handler = on_sigpipe;
		sigemptyset(&pipe.sa_mask);
		sigaction(SIGPIPE, &pipe, &old_pipe_);
	}
	SignalHandlers(const SignalHandlers &) = delete;
	SignalHandlers &operator=(const SignalHandlers &) = delete;
	~SignalHandlers() { restore(); }

	void restore()
	{
		if (restored_)
			return;
		restored_ = true;
		for (size_t i = 0; i < kSignals.size(); i++)
			sigaction(kSignals[i], &old_[i], nullptr);
		sigaction(SIGPIPE, &old_pipe_, nullptr);
	}

private:
	static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
	std::array<struct sigaction, 3> old_{};
	struct sigaction old_pipe_ = {};
	bool restored_ = false;
};

// Sleeps up to ms; a signal ends the sleep early.
void pause_ms(long ms)
{
	timespec ts{ms / 1000, (ms % 1000) * 1000000};
	nanosleep(&ts, nullptr);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

long ms_left(Clock::time_point deadline)
{
	return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

// ---- text ----

std::string mib(uint64_t bytes) { return format("%.1f MiB", static_cast<double>(bytes) / (1 << 20)); }

// A line of a program's or CRIU's output made safe for a terminal, JSON and XML: valid UTF-8, no control
// characters but tabs, at most kMaxLineBytes.
std::string clean_line(std::string_view s)
{
	std::string out;
	for (size_t i = 0; i < s.size() && out.size() < kMaxLineBytes;) {
		auto c = static_cast<unsigned char>(s[i]);
		if (c == '\t' || (c >= 0x20 && c != 0x7f && c < 0x80)) {
			out += static_cast<char>(c);
			i++;
		} else if (size_t len = c >= 0x80 ? utf8_sequence_length(s, i) : 0; len > 1) {
			out.append(s.substr(i, len));
			i += len;
		} else {
			out += '?';
			i++;
		}
	}
	if (out.size() >= kMaxLineBytes)
		out += "...";
	return out;
}

// The command as a shell would take it back, for messages.
std::string shell_join(const std::vector<std::string> &argv)
{
	std::string out;
	for (const std::string &a : argv) {
		if (!out.empty())
			out += ' ';
		bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
							       "-_./=:,+@%") == std::string::npos;
		if (plain) {
			out += a;
			continue;
		}
		out += '\'';
		for (char c : a)
			out += c == '\'' ? std::string("'\\''") : std::string(1, c);
		out += '\'';
	}
	return out;
}

std::string basename_of(const std::string &path)
{
	size_t slash = path.rfind('/');
	return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string signal_name(int signo)
{
	const char *abbrev = sigabbrev_np(signo);
	return abbrev ? format("SIG%s", abbrev) : format("signal %d", signo);
}

// ---- logs ----

// Lines of a file that explain a failure, and where they come from.
struct LogBlock {
	std::string file;
	std::vector<std::string> lines;
};

// The lines of the last kMaxLogTail bytes of path (the first, possibly cut, line dropped when cut).
std::vector<std::string> read_lines(const std::string &path)
{
	std::vector<std::string> lines;
	std::ifstream f(path, std::ios::binary);
	if (!f)
		return lines;
	f.seekg(0, std::ios::end);
	std::streamoff size = f.tellg();
	bool cut = size > kMaxLogTail;
	f.seekg(cut ? size - kMaxLogTail : 0);
	std::string line;
	while (std::getline(f, line)) {
		if (cut) {
			cut = false;
			continue;
		}
		if (!line.empty() && line.back() == '\r')
			line.pop_back();
		lines.push_back(clean_line(line));
	}
	return lines;
}

// The last n lines of a program's output (or of any file).
LogBlock tail_of(const std::string &path, size_t n = kExplainLines)
{
	std::vector<std::string> all = read_lines(path);
	size_t from = all.size() > n ? all.size() - n : 0;
	return {path, std::vector<std::string>(all.begin() + static_cast<long>(from), all.end())};
}

// What a CRIU log says about a failure: its error lines and, in the room left, the last lines of our
// plugin, in the order of the log; its end when neither is there.
LogBlock criu_log_excerpt(const std::string &path)
{
	std::vector<std::string> all = read_lines(path);
	std::vector<size_t> errors, plugin;
	for (size_t i = 0; i < all.size(); i++) {
		if (all[i].find("Error") != std::string::npos)
			errors.push_back(i);
		else if (all[i].find("cuda_plugin: ") != std::string::npos)
			plugin.push_back(i);
	}
	if (errors.empty() && plugin.empty())
		return tail_of(path);
	if (errors.size() > kExplainLines)
		errors.erase(errors.begin(), errors.end() - static_cast<long>(kExplainLines));
	size_t room = kExplainLines - errors.size();
	if (plugin.size() > room)
		plugin.erase(plugin.begin(), plugin.end() - static_cast<long>(room));
	std::vector<size_t> keep = errors;
	keep.insert(keep.end(), plugin.begin(), plugin.end());
	std::sort(keep.begin(), keep.end());
	LogBlock b{path, {}};
	for (size_t i : keep)
		b.lines.push_back(all[i]);
	return b;
}

struct HintRule {
	const char *needle;
	const char *hint;
};

const HintRule kHints[] = {
	{"Connected TCP socket",
	 "the program holds an established TCP connection, which CRIU does not checkpoint by default: close it "
	 "before the checkpoint, or pass --criu-arg --tcp-established (the peer must then live with the "
	 "connection being frozen and restored)"},
	{"In-flight connection", "a listening socket has connections not yet accepted: --criu-arg --skip-in-flight "
				 "drops them"},
	{"External socket is used", "the program is connected to a unix socket outside its process tree: "
				    "--criu-arg --ext-unix-sk lets CRIU dump it"},
	{"error while loading shared libraries",
	 "criu cannot find its shared libraries: give their directory with --criu-env LD_LIBRARY_PATH=DIR"},
	{"has bad size", "a file the program had open changed between the dump and the restore; CRIU restores "
			 "only onto the same file (open logs with O_APPEND, write state files in place)"},
	{"cuda_plugin: ", "the lines of cuda_plugin say what the GPU side did; 'cuda-criu check' checks the "
			  "driver, CRIU and the plugin"},
};

std::string hint_for(const std::vector<LogBlock> &logs)
{
	for (const HintRule &rule : kHints)
		for (const LogBlock &b : logs)
			for (const std::string &line : b.lines)
				if (line.find(rule.needle) != std::string::npos)
					return rule.hint;
	return {};
}

// ---- files and processes ----

uint64_t tree_bytes(const std::string &dir)
{
	uint64_t total = 0;
	std::error_code ec;
	for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
	     !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
		if (it->is_regular_file(ec))
			if (uintmax_t n = it->file_size(ec); !ec)
				total += n;
	return total;
}

// The process pid and its descendants, parents before children.
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

// The processes whose session or process group is id, read from /proc/PID/stat.
std::vector<pid_t> session_members(pid_t id)
{
	std::vector<pid_t> out;
	std::unique_ptr<DIR, int (*)(DIR *)> dir(opendir("/proc"), closedir);
	if (!dir)
		return out;
	while (const dirent *de = readdir(dir.get())) {
		char *end = nullptr;
		long pid = std::strtol(de->d_name, &end, 10);
		if (pid <= 0 || *end != '\0')
			continue;
		std::ifstream f(std::string("/proc/") + de->d_name + "/stat");
		std::string stat;
		std::getline(f, stat);
		// "PID (COMM) STATE PPID PGRP SESSION ...": COMM may hold anything, the last ')' ends it.
		size_t paren = stat.rfind(')');
		int pgrp = 0, session = 0;
		if (paren != std::string::npos &&
		    std::sscanf(stat.c_str() + paren + 1, " %*c %*d %d %d", &pgrp, &session) == 2 &&
		    (pgrp == id || session == id))
			out.push_back(static_cast<pid_t>(pid));
	}
	return out;
}

bool is_zombie(pid_t pid)
{
	auto st = read_task_status(pid);
	return st && st->state == 'Z';
}

// argv[0] as execve needs it: a name without a slash is looked up in $PATH.
Result<std::string> resolve_program(const std::string &name)
{
	if (name.find('/') != std::string::npos)
		return name;
	const char *path = std::getenv("PATH");
	std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
	size_t start = 0;
	for (;;) {
		size_t colon = dirs.find(':', start);
		std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
		std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
		struct stat st = {};
		if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0)
			return candidate;
		if (colon == std::string::npos)
			break;
		start = colon + 1;
	}
	return make_error(ENOENT, "%s: no such program in $PATH", name.c_str());
}

// Whether 127.0.0.1:port accepts a connection. The connection is closed politely (our side first, then
// a wait of up to a second for the program to close its side), so that no half-closed connection of the
// probe is left in the program when CRIU dumps it.
bool port_accepts(uint16_t port)
{
	UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
	if (!fd.valid())
		return false;
	sockaddr_in addr = {};
	addr.sin_family = AF_INET;
	addr.sin_port = htons(port);
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd.get(), reinterpret_cast<const sockaddr *>(&addr), sizeof(addr)) != 0) {
		if (errno != EINPROGRESS)
			return false;
		pollfd p{fd.get(), POLLOUT, 0};
		if (poll(&p, 1, 1000) != 1)
			return false;
		int err = 0;
		socklen_t len = sizeof(err);
		if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
			return false;
	}
	shutdown(fd.get(), SHUT_WR);
	auto deadline = Clock::now() + std::chrono::seconds(1);
	for (long left = 1000; left > 0; left = ms_left(deadline)) {
		pollfd p{fd.get(), POLLIN, 0};
		if (poll(&p, 1, static_cast<int>(left)) <= 0)
			break;
		char buf[4096];
		ssize_t n = read(fd.get(), buf, sizeof(buf));
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			break;
	}
	return true;
}

// A compiled POSIX extended regular expression.
class Regex {
public:
	static Result<Regex> compile(const std::string &pattern)
	{
		auto re = std::make_unique<regex_t>();
		if (int rc = regcomp(re.get(), pattern.c_str(), REG_EXTENDED | REG_NOSUB); rc != 0) {
			char msg[256];
			regerror(rc, re.get(), msg, sizeof(msg));
			return make_error(EINVAL, "'%s' is not a regular expression: %s", pattern.c_str(), msg);
		}
		// Compiled: from here on regfree() is owed.
		return Regex(std::unique_ptr<regex_t, Free>(re.release()));
	}
	bool matches(const std::string &s) const { return regexec(re_.get(), s.c_str(), 0, nullptr, 0) == 0; }

private:
	struct Free {
		void operator()(regex_t *re) const
		{
			regfree(re);
			delete re;
		}
	};
	explicit Regex(std::unique_ptr<regex_t, Free> re) : re_(std::move(re)) {}
	std::unique_ptr<regex_t, Free> re_;
};

// ---- options ----

enum class ReadyKind { None, File, Log, Port, Delay };

struct RoundtripOptions {
	std::vector<std::string> command;
	std::string name;
	std::string criu;
	std::string libdir = kCriuDefaultLibdir;
	std::string dir;
	bool keep_images = false;
	ReadyKind ready = ReadyKind::None;
	std::string ready_file;
	std::string ready_log;
	uint16_t ready_port = 0;
	unsigned ready_delay_ms = 0;
	std::string health_cmd;
	unsigned long repeat = 1;
	bool leave_running = false;
	bool require_cuda = false;
	std::optional<std::string> device_map;
	unsigned start_ms = kDefaultStartMs;
	unsigned dump_ms = kDefaultDumpMs;
	unsigned restore_ms = kDefaultRestoreMs;
	unsigned health_ms = kDefaultHealthMs;
	unsigned settle_ms = kDefaultSettleMs;
	std::vector<std::string> criu_env;
	std::vector<std::string> criu_args;
	std::string json_path;
	std::string junit_path;
};

// ---- steps ----

enum class StepStatus { Ok, Failed, Skipped };

struct Step {
	unsigned cycle = 0; // 0: before the first dump (setup, start)
	std::string name;
	StepStatus status = StepStatus::Skipped;
	double seconds = 0;
	std::string detail; // what was seen (ok), or what went wrong (failed)
	std::string hint;
	std::vector<LogBlock> logs; // the lines that explain a failure
	// dump only; -1: not known
	int64_t image_bytes = -1;
	int64_t gpu_state_bytes = -1;
	int cuda_processes = -1;
};

Step planned(unsigned cycle, const char *name)
{
	Step s;
	s.cycle = cycle;
	s.name = name;
	return s;
}

const char *status_word(StepStatus s)
{
	switch (s) {
	case StepStatus::Ok:
		return "ok";
	case StepStatus::Failed:
		return "FAIL";
	case StepStatus::Skipped:
		break;
	}
	return "skip";
}

std::string step_label(const Step &s)
{
	return s.cycle ? format("cycle %u: %s", s.cycle, s.name.c_str()) : s.name;
}

// ---- XML ----

std::string xml_escape(std::string_view s, bool attribute)
{
	std::string out;
	for (char c : s) {
		switch (c) {
		case '&':
			out += "&amp;";
			break;
		case '<':
			out += "&lt;";
			break;
		case '>':
			out += "&gt;";
			break;
		case '"':
			out += attribute ? "&quot;" : "\"";
			break;
		case '\n':
			out += attribute ? "&#10;" : "\n";
			break;
		case '\t':
			out += attribute ? "&#9;" : "\t";
			break;
		default:
			// clean_line() left no other control characters; this keeps the document valid anyway.
			out += static_cast<unsigned char>(c) < 0x20 ? '?' : c;
		}
	}
	return out;
}

// ---- the round trip ----

class Roundtrip {
public:
	explicit Roundtrip(RoundtripOptions o) : o_(std::move(o)) {}
	Roundtrip(const Roundtrip &) = delete;
	Roundtrip &operator=(const Roundtrip &) = delete;
	~Roundtrip() { cleanup(); }

	int run()
	{
		SignalHandlers handlers;
		t0_ = Clock::now();
		started_unix_ = std::time(nullptr);
		plan();
		std::printf("cuda-criu roundtrip %s: %s\n", o_.name.c_str(), shell_join(o_.command).c_str());
		std::printf("%5s  %-8s %-6s %10s  %s\n", "CYCLE", "STEP", "RESULT", "TIME", "DETAIL");
		std::fflush(stdout);

		bool ok = setup() && start();
		for (unsigned c = 1; ok && c <= o_.repeat; c++)
			ok = cycle(c);
		cleanup();

		int status = kExitOk;
		const Step *failed = failed_step();
		if (failed)
			status = failed->cycle == 0 ? kExitRoundtripNotRun : kExitFailure;
		summary(failed);
		if (!write_reports(status) && status == kExitOk)
			status = kExitRoundtripNotRun;
		std::fflush(stdout);
		handlers.restore();
		if (int signo = g_signal; signo != 0) {
			// Ended by the signal, as the shell or CI runner that sent it expects.
			std::signal(signo, SIG_DFL);
			std::raise(signo);
			return 128 + signo;
		}
		return status;
	}

private:
	// ---- the table ----

	void plan()
	{
		steps_.push_back(planned(0, "setup"));
		steps_.push_back(planned(0, "start"));
		for (unsigned c = 1; c <= o_.repeat; c++) {
			std::vector<const char *> names = {"dump", "exit", "restore", "health"};
			if (o_.leave_running)
				names = {"dump", "running", "kill", "restore", "health"};
			for (const char *n : names)
				steps_.push_back(planned(c, n));
		}
	}

	Step &begin(unsigned cycle, const char *name)
	{
		step_t0_ = Clock::now();
		for (Step &s : steps_)
			if (s.cycle == cycle && s.name == name)
				return s;
		steps_.push_back(planned(cycle, name));
		return steps_.back();
	}

	void print(const Step &s)
	{
		std::string cycle = s.cycle ? std::to_string(s.cycle) : "-";
		std::printf("%5s  %-8s %-6s %8.2f s  %s\n", cycle.c_str(), s.name.c_str(), status_word(s.status),
			    s.seconds, s.detail.c_str());
		const std::string indent(35, ' '); // under DETAIL
		if (!s.hint.empty())
			std::printf("%shint: %s\n", indent.c_str(), s.hint.c_str());
		for (const LogBlock &b : s.logs) {
			if (b.lines.empty())
				continue;
			std::printf("%s%s:\n", indent.c_str(), b.file.c_str());
			for (const std::string &l : b.lines)
				std::printf("%s  %s\n", indent.c_str(), l.c_str());
		}
		std::fflush(stdout);
	}

	bool ok(Step &s, std::string detail)
	{
		s.status = StepStatus::Ok;
		s.seconds = seconds_since(step_t0_);
		s.detail = std::move(detail);
		print(s);
		return true;
	}

	bool fail(Step &s, std::string detail, std::vector<LogBlock> logs = {}, std::string hint = {})
	{
		s.status = StepStatus::Failed;
		s.seconds = seconds_since(step_t0_);
		s.detail = std::move(detail);
		std::erase_if(logs, [](const LogBlock &b) { return b.lines.empty(); });
		s.hint = hint.empty() ? hint_for(logs) : std::move(hint);
		s.logs = std::move(logs);
		print(s);
		return false;
	}

	bool fail_interrupted(Step &s)
	{
		return fail(s, format("interrupted by %s: stopping, killing what was started and removing what was "
				      "created",
				      signal_name(g_signal).c_str()));
	}

	const Step *failed_step() const
	{
		for (const Step &s : steps_)
			if (s.status == StepStatus::Failed)
				return &s;
		return nullptr;
	}

	// ---- setup ----

	bool setup()
	{
		Step &s = begin(0, "setup");
		if (geteuid() != 0)
			return fail(s, "not root", {}, "CRIU needs root: run 'sudo cuda-criu roundtrip ...'");
		if (auto made = make_work_dir(); !made)
			return fail(s, made.error().message());
		auto loc = find_criu(o_.criu);
		if (!loc)
			return fail(s, loc.error().message(), {}, "install CRIU 4.0 or newer, or pass --criu PATH");
		if (loc->only_in_path)
			return fail(s, "criu found only through $PATH at " + loc->path, {},
				    "pass --criu " + loc->path + " to use it");
		criu_ = loc->path;
		if (!check_criu_version(s))
			return false;
		std::string plugin = o_.libdir + "/" + kPluginFileName;
		auto ours = file_contains(plugin, kPluginMarker);
		if (!ours)
			return fail(s, "plugin: " + ours.error().message(), {},
				    "give the directory holding cuda_plugin.so with --libdir, or install it into /usr/lib/criu");
		if (!*ours)
			return fail(s, plugin + " is CRIU's own CUDA plugin, not cuda-criu's", {},
				    "point --libdir at the directory of this project's cuda_plugin.so");
		if (o_.ready == ReadyKind::Port && port_accepts(o_.ready_port))
			return fail(s, format("127.0.0.1:%u accepts connections before the program has started", o_.ready_port),
				    {}, "another process listens on that port: stop it, or wait for another port");
		if (o_.ready == ReadyKind::Log) {
			auto re = Regex::compile(o_.ready_log);
			if (!re)
				return fail(s, "--ready-log: " + re.error().message());
			ready_re_ = std::make_unique<Regex>(std::move(*re));
		}
		// Whatever the program forks, and what `criu restore -d` brings back, is reparented here once its
		// parent ends: to be waited for, and killed at the end.
		if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
			return fail(s, "prctl(PR_SET_CHILD_SUBREAPER): " + errno_string(errno));
		return ok(s, format("CRIU %s (%s), plugin %s, work directory %s", criu_version_.c_str(), criu_.c_str(),
				    plugin.c_str(), work_dir_.c_str()));
	}

	Status make_work_dir()
	{
		std::error_code ec;
		if (o_.dir.empty()) {
			const char *tmp = std::getenv("TMPDIR");
			std::string base = std::string(tmp && *tmp ? tmp : "/tmp") + "/cuda-criu-roundtrip.XXXXXX";
			std::vector<char> tmpl(base.begin(), base.end());
			tmpl.push_back('\0');
			if (!mkdtemp(tmpl.data()))
				return make_error(errno, "cannot create a work directory %s: %s", base.c_str(),
						  errno_string(errno).c_str());
			work_dir_ = tmpl.data();
			created_dir_ = true;
		} else if (std::filesystem::exists(o_.dir, ec)) {
			if (!std::filesystem::is_directory(o_.dir, ec))
				return make_error(ENOTDIR, "--dir %s is not a directory", o_.dir.c_str());
			if (!std::filesystem::is_empty(o_.dir, ec))
				return make_error(EEXIST, "--dir %s is not empty (the round trip needs a fresh directory)",
						  o_.dir.c_str());
			work_dir_ = o_.dir;
		} else {
			if (mkdir(o_.dir.c_str(), 0700) != 0)
				return make_error(errno, "mkdir %s: %s", o_.dir.c_str(), errno_string(errno).c_str());
			work_dir_ = o_.dir;
			created_dir_ = true;
		}
		// Absolute: CRIU, the health command and the messages all get the same path.
		if (auto abs = std::filesystem::absolute(work_dir_, ec); !ec)
			work_dir_ = abs.lexically_normal().string();
		if (!work_dir_.empty() && work_dir_.back() == '/')
			work_dir_.pop_back();
		program_log_ = work_dir_ + "/program.log";
		health_out_ = work_dir_ + "/health.out";
		return {};
	}

	bool check_criu_version(Step &s)
	{
		std::string out_path = work_dir_ + "/criu-version.out";
		auto st = run_tool({criu_, "--version"}, o_.criu_env, out_path, kVersionMs);
		std::vector<std::string> lines = read_lines(out_path);
		if (!st)
			return fail(s, "criu --version: " + st.error().message(), {tail_of(out_path)});
		if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0)
			return fail(s, criu_ + " --version " + describe_wait_status(*st), {tail_of(out_path)});
		int major = 0, minor = 0;
		for (const std::string &l : lines)
			if (size_t at = l.find("Version:"); at != std::string::npos)
				if (std::sscanf(l.c_str() + at + 8, "%d.%d", &major, &minor) == 2)
					criu_version_ = l.substr(l.find_first_not_of(' ', at + 8));
		if (criu_version_.empty())
			return fail(s, criu_ + " --version printed no version", {tail_of(out_path)});
		if (major < 4)
			return fail(s, "CRIU " + criu_version_ + " predates 4.0 (no device hooks)", {},
				    "install CRIU 4.0 or newer");
		return true;
	}

	// ---- start ----

	bool start()
	{
		Step &s = begin(0, "start");
		auto exe = resolve_program(o_.command[0]);
		if (!exe)
			return fail(s, exe.error().message());
		UniqueFd log(open(program_log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
		if (!log.valid())
			return fail(s, format("create %s: %s", program_log_.c_str(), errno_string(errno).c_str()));
		Baseline b = baseline();
		SpawnOptions so;
		so.argv = o_.command;
		so.argv[0] = *exe;
		// What CRIU needs of a process tree's root without options: no terminal (its own session), and
		// plain files as its standard streams. O_APPEND: CRIU checks no size of such a file at restore.
		so.new_session = true;
		so.stdout_fd = so.stderr_fd = log.get();
		auto child = Child::spawn(so);
		if (!child)
			return fail(s, child.error().message());
		program_ = std::move(*child);
		root_ = program_.pid();

		auto deadline = Clock::now() + std::chrono::milliseconds(o_.start_ms);
		std::string what;
		if (o_.ready == ReadyKind::None) {
			if (!await_health(s, b, deadline, "start", what))
				return false;
		} else {
			for (;;) {
				if (interrupted())
					return fail_interrupted(s);
				std::string why;
				if (!root_alive(why))
					return fail(s, why + " before it was ready", {tail_of(program_log_)});
				if (criterion_met(b, what))
					break;
				if (Clock::now() >= deadline)
					return fail(s,
						    format("the program was not ready within %g s: %s", o_.start_ms / 1000.0,
							   not_met(b).c_str()),
						    {tail_of(program_log_)}, "a slow start needs a longer --start-timeout");
				pause_ms(kPollMs);
			}
			if (!o_.health_cmd.empty()) {
				// The health command is checked once before any checkpoint: a command that never passes
				// is not the restore's fault.
				std::string healthy;
				auto hdeadline = Clock::now() + std::chrono::milliseconds(o_.health_ms);
				if (!await_health(s, b, hdeadline, "start", healthy))
					return false;
				what += "; " + healthy;
			}
		}
		return ok(s, format("pid %d ready: %s", root_, what.c_str()));
	}

	// ---- readiness and health ----

	// What the readiness criterion compares with: the state of things when a step began.
	struct Baseline {
		Clock::time_point when;
		bool file_existed = false;
		timespec mtime{};
		ino_t inode = 0;
		off_t log_offset = 0;
		std::string pending; // a started line of the program's output
	};

	Baseline baseline() const
	{
		Baseline b;
		b.when = Clock::now();
		struct stat st = {};
		if (o_.ready == ReadyKind::File && stat(o_.ready_file.c_str(), &st) == 0) {
			b.file_existed = true;
			b.mtime = st.st_mtim;
			b.inode = st.st_ino;
		}
		if (o_.ready == ReadyKind::Log && stat(program_log_.c_str(), &st) == 0)
			b.log_offset = st.st_size;
		return b;
	}

	// Whether the readiness criterion holds now, compared with b; what: how it was seen.
	bool criterion_met(Baseline &b, std::string &what)
	{
		switch (o_.ready) {
		case ReadyKind::File: {
			struct stat st = {};
			if (stat(o_.ready_file.c_str(), &st) != 0)
				return false;
			if (!b.file_existed) {
				what = o_.ready_file + " appeared";
				return true;
			}
			if (st.st_ino != b.inode || st.st_mtim.tv_sec != b.mtime.tv_sec ||
			    st.st_mtim.tv_nsec != b.mtime.tv_nsec) {
				what = o_.ready_file + " was modified";
				return true;
			}
			return false;
		}
		case ReadyKind::Log:
			return log_matches(b, what);
		case ReadyKind::Port:
			if (!port_accepts(o_.ready_port))
				return false;
			what = format("127.0.0.1:%u accepts connections", o_.ready_port);
			return true;
		case ReadyKind::Delay:
			if (seconds_since(b.when) * 1000 < o_.ready_delay_ms)
				return false;
			what = format("still running after %g s", o_.ready_delay_ms / 1000.0);
			return true;
		case ReadyKind::None:
			break;
		}
		return false;
	}

	std::string not_met(const Baseline &b) const
	{
		switch (o_.ready) {
		case ReadyKind::File:
			return o_.ready_file + (b.file_existed ? " was not modified" : " did not appear");
		case ReadyKind::Log:
			return "no new line of its output matched '" + o_.ready_log + "'";
		case ReadyKind::Port:
			return format("127.0.0.1:%u accepted no connection", o_.ready_port);
		case ReadyKind::Delay:
		case ReadyKind::None:
			break;
		}
		return "it did not get ready";
	}

	// Reads what the program wrote since b.log_offset and matches each line (and a started one).
	bool log_matches(Baseline &b, std::string &what)
	{
		UniqueFd fd(open(program_log_.c_str(), O_RDONLY | O_CLOEXEC));
		if (!fd.valid())
			return false;
		char buf[65536];
		ssize_t n = 0;
		while ((n = pread(fd.get(), buf, sizeof(buf), b.log_offset)) > 0) {
			b.log_offset += n;
			b.pending.append(buf, static_cast<size_t>(n));
			size_t nl = 0;
			while ((nl = b.pending.find('\n')) != std::string::npos) {
				std::string line = b.pending.substr(0, nl);
				b.pending.erase(0, nl + 1);
				if (ready_re_->matches(line)) {
					what = "its output matched: " + clean_line(line);
					return true;
				}
			}
			// A line that never ends must not grow without bound.
			if (b.pending.size() > (1 << 20))
				b.pending.erase(0, b.pending.size() - 4096);
		}
		if (!b.pending.empty() && ready_re_->matches(b.pending)) {
			what = "its output matched: " + clean_line(b.pending);
			b.pending.clear();
			return true;
		}
		return false;
	}

	// Whether the program's root process still runs; why not, in why.
	bool root_alive(std::string &why)
	{
		if (program_.running()) {
			auto st = program_.wait(1);
			if (st) {
				std::string how = describe_wait_status(*st);
				why = format("the program (pid %d) %s%s", root_, how.rfind("killed", 0) == 0 ? "was " : "",
					     how.c_str());
				return false;
			}
			return true;
		}
		if (!process_exists(root_) || is_zombie(root_)) {
			why = format("the program (pid %d) has ended", root_);
			return false;
		}
		return true;
	}

	// Waits until deadline for the program to be healthy: the health command passes when there is one,
	// else the readiness criterion holds again, compared with b. Fails s when it does not.
	bool await_health(Step &s, Baseline &b, Clock::time_point deadline, const char *phase, std::string &what)
	{
		std::string last;
		for (;;) {
			if (interrupted())
				return fail_interrupted(s);
			std::string why;
			if (!root_alive(why))
				return fail(s, why, {tail_of(program_log_)});
			if (!o_.health_cmd.empty()) {
				Outcome r = run_health_cmd(deadline, s.cycle, phase, last);
				if (r == Outcome::Interrupted)
					return fail_interrupted(s);
				if (r == Outcome::NotRun)
					return fail(s, "the health command: " + last);
				if (r == Outcome::Passed) {
					if (!root_alive(why))
						return fail(s, why, {tail_of(program_log_)});
					what = "the health command passed";
					return true;
				}
			} else if (criterion_met(b, what)) {
				return true;
			}
			if (Clock::now() >= deadline) {
				double secs = seconds_since(b.when);
				if (!o_.health_cmd.empty())
					return fail(s, format("the health command did not pass within %.1f s: %s", secs, last.c_str()),
						    {tail_of(health_out_), tail_of(program_log_)});
				return fail(s, format("not healthy within %.1f s: %s", secs, not_met(b).c_str()),
					    {tail_of(program_log_)},
					    o_.ready == ReadyKind::File || o_.ready == ReadyKind::Log
						    ? "a program that shows it is ready only once needs a --health-cmd"
						    : std::string());
			}
			pause_ms(o_.health_cmd.empty() ? kPollMs : kHealthRetryMs);
		}
	}

	// After a passed health check, the program must live on for --settle: one sign of life right after
	// a restore does not show that it survived it.
	bool settle(Step &s, std::string &what)
	{
		auto until = Clock::now() + std::chrono::milliseconds(o_.settle_ms);
		for (;;) {
			if (interrupted())
				return fail_interrupted(s);
			std::string why;
			if (!root_alive(why))
				return fail(s, format("%s, then %s within the %g s it had to live on (--settle)", what.c_str(),
						      why.c_str(), o_.settle_ms / 1000.0),
					    {tail_of(program_log_)});
			if (Clock::now() >= until)
				break;
			pause_ms(kPollMs);
		}
		if (o_.settle_ms)
			what += format(", and lived on for %g s", o_.settle_ms / 1000.0);
		return true;
	}

	enum class Outcome { Passed, Failed, NotRun, Interrupted };

	// One run of the health command, killed at deadline. result: how it ended.
	Outcome run_health_cmd(Clock::time_point deadline, unsigned cycle, const char *phase, std::string &result)
	{
		UniqueFd out(open(health_out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
		if (!out.valid()) {
			result = format("create %s: %s", health_out_.c_str(), errno_string(errno).c_str());
			return Outcome::NotRun;
		}
		SpawnOptions so;
		so.argv = {"/bin/sh", "-c", o_.health_cmd};
		so.stdout_fd = so.stderr_fd = out.get();
		// Its own process group: what it starts is killed with it when it overruns.
		so.new_session = true;
		so.env_set = {"ROUNDTRIP_PID=" + std::to_string(root_), "ROUNDTRIP_CYCLE=" + std::to_string(cycle),
			      std::string("ROUNDTRIP_PHASE=") + phase, "ROUNDTRIP_LOG=" + program_log_,
			      "ROUNDTRIP_DIR=" + work_dir_};
		auto child = Child::spawn(so);
		if (!child) {
			result = child.error().message();
			return Outcome::NotRun;
		}
		for (;;) {
			auto st = child->wait(static_cast<unsigned>(kPollMs));
			if (st) {
				if (WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
					return Outcome::Passed;
				result = describe_wait_status(*st);
				return Outcome::Failed;
			}
			if (st.error().errno_value() != ETIMEDOUT) {
				result = st.error().message();
				return Outcome::NotRun;
			}
			bool late = Clock::now() >= deadline;
			if (interrupted() || late) {
				kill(-child->pid(), SIGKILL); // not reaped yet: the group still exists
				child->kill_and_reap();
				if (!late)
					return Outcome::Interrupted;
				result = "it was still running at the deadline (killed)";
				return Outcome::Failed;
			}
		}
	}

	// ---- CRIU ----

	// Runs argv (criu) with env added to ours, its output into out_path, killed after timeout_ms or on a
	// signal (EINTR). Returns the wait status.
	static Result<int> run_tool(const std::vector<std::string> &argv, const std::vector<std::string> &env,
				    const std::string &out_path, unsigned timeout_ms)
	{
		UniqueFd out(open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
		if (!out.valid())
			return errno_error("create %s", out_path.c_str());
		SpawnOptions so;
		so.argv = argv;
		so.env_set = env;
		so.stdout_fd = so.stderr_fd = out.get();
		auto child = Child::spawn(so);
		if (!child)
			return std::move(child).error();
		auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
		for (;;) {
			auto st = child->wait(static_cast<unsigned>(kPollMs));
			if (st)
				return *st;
			if (st.error().errno_value() != ETIMEDOUT)
				return std::move(st).error();
			if (interrupted())
				return make_error(EINTR, "interrupted by %s (criu killed)", signal_name(g_signal).c_str());
			if (Clock::now() >= deadline)
				return make_error(ETIMEDOUT, "still running after %g s (killed)", timeout_ms / 1000.0);
		}
	}

	// Runs criu ACTION; false when it did not exit 0, with s failed and the log lines that explain it.
	bool run_criu(Step &s, const char *action, const std::vector<std::string> &args,
		      const std::vector<std::string> &env, const std::string &log, unsigned timeout_ms)
	{
		std::vector<std::string> argv = {criu_};
		argv.insert(argv.end(), args.begin(), args.end());
		argv.insert(argv.end(), o_.criu_args.begin(), o_.criu_args.end());
		std::string out_path = format("%s/criu-%s-%u.out", work_dir_.c_str(), action, s.cycle);
		auto st = run_tool(argv, env, out_path, timeout_ms);
		if (!st && st.error().errno_value() == EINTR)
			return fail_interrupted(s);
		std::vector<LogBlock> logs = {tail_of(out_path), criu_log_excerpt(log)};
		if (!st)
			return fail(s, format("criu %s %s", action, st.error().message().c_str()), logs,
				    st.error().errno_value() == ETIMEDOUT
					    ? format("a larger program may need a longer --%s-timeout", action)
					    : std::string());
		if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0)
			return fail(s, format("criu %s %s", action, describe_wait_status(*st).c_str()), logs);
		return true;
	}

	std::string images(unsigned cycle) const { return format("%s/images-%u", work_dir_.c_str(), cycle); }

	// ---- one cycle ----

	bool cycle(unsigned c)
	{
		if (!dump(c))
			return false;
		if (o_.leave_running) {
			if (!still_running(c) || !kill_for_restore(c))
				return false;
		} else if (!wait_exit(c)) {
			return false;
		}
		if (!restore(c) || !health(c))
			return false;
		if (!o_.keep_images) {
			// GPU images are large: each goes as soon as its cycle has passed.
			std::error_code ec;
			std::filesystem::remove_all(images(c), ec);
		}
		return true;
	}

	bool dump(unsigned c)
	{
		Step &s = begin(c, "dump");
		std::string dir = images(c);
		if (mkdir(dir.c_str(), 0700) != 0)
			return fail(s, format("mkdir %s: %s", dir.c_str(), errno_string(errno).c_str()));
		tree_ = tree_of(root_);
		std::vector<std::string> args = {"dump", "-t", std::to_string(root_), "-D", dir, "-L", o_.libdir,
						  "-v4", "-o", "dump.log"};
		if (o_.leave_running)
			args.emplace_back("--leave-running");
		// The readiness probe's own connections must not stop the dump.
		if (o_.ready == ReadyKind::Port)
			args.emplace_back("--skip-in-flight");
		if (!run_criu(s, "dump", args, o_.criu_env, dir + "/dump.log", o_.dump_ms))
			return false;
		after_dump_ = baseline();

		s.image_bytes = static_cast<int64_t>(tree_bytes(dir));
		std::string gpu = "no CUDA process recorded by the plugin";
		UniqueFd dfd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
		auto img = read_image(dfd.get());
		if (!img)
			return fail(s, format("the plugin's image in %s: %s", dir.c_str(), img.error().message().c_str()));
		if (img->has_value()) {
			uint64_t bytes = 0;
			for (const ProcessRecord &p : (*img)->processes)
				bytes += p.state_bytes;
			s.gpu_state_bytes = static_cast<int64_t>(bytes);
			s.cuda_processes = static_cast<int>((*img)->processes.size());
			gpu = format("GPU state %s of %d CUDA process(es)", mib(bytes).c_str(), s.cuda_processes);
		} else {
			s.cuda_processes = 0;
			s.gpu_state_bytes = 0;
		}
		if (o_.require_cuda && s.cuda_processes == 0)
			return fail(s,
				    format("the dump holds no CUDA process (--require-cuda): %s", gpu.c_str()),
				    {criu_log_excerpt(dir + "/dump.log")},
				    "is the program on the GPU yet when it is ready? is --libdir the directory of "
				    "cuda-criu's cuda_plugin.so?");
		return ok(s, format("%zu process(es), image %s, %s", tree_.size(), mib(s.image_bytes).c_str(), gpu.c_str()));
	}

	// Waits until every pid of tree_ is gone, reaping those that are children here.
	bool wait_gone(Step &s, const char *after)
	{
		auto deadline = Clock::now() + std::chrono::milliseconds(o_.dump_ms);
		for (;;) {
			// The root's pid is also its session's and process group's id: CRIU can give it back only once
			// no process holds it in any role, a zombie child of this subreaper (a child forked after
			// tree_ was taken) included.
			std::set<pid_t> pids(tree_.begin(), tree_.end());
			for (pid_t p : session_members(root_))
				pids.insert(p);
			std::vector<pid_t> left;
			for (pid_t p : pids) {
				if (p == program_.pid())
					(void)program_.wait(1);
				else if (parent_of(p) == getpid())
					waitpid(p, nullptr, WNOHANG);
				if (process_exists(p))
					left.push_back(p);
			}
			if (left.empty())
				return ok(s, format("%zu process(es) gone %s", tree_.size(), after));
			if (interrupted())
				return fail_interrupted(s);
			if (Clock::now() >= deadline) {
				std::string pids;
				for (pid_t p : left)
					pids += (pids.empty() ? "" : " ") + std::to_string(p);
				return fail(s, format("pid(s) %s still there %g s %s", pids.c_str(), o_.dump_ms / 1000.0, after),
					    {tail_of(program_log_)});
			}
			pause_ms(kPollMs);
		}
	}

	bool wait_exit(unsigned c)
	{
		Step &s = begin(c, "exit");
		return wait_gone(s, "after the dump");
	}

	bool still_running(unsigned c)
	{
		Step &s = begin(c, "running");
		std::string what;
		auto deadline = Clock::now() + std::chrono::milliseconds(o_.health_ms);
		if (!await_health(s, after_dump_, deadline, "running", what) || !settle(s, what))
			return false;
		return ok(s, format("pid %d kept running after the dump: %s", root_, what.c_str()));
	}

	bool kill_for_restore(unsigned c)
	{
		Step &s = begin(c, "kill");
		tree_ = tree_of(root_);
		for (pid_t p : session_members(root_))
			if (std::find(tree_.begin(), tree_.end(), p) == tree_.end())
				tree_.push_back(p);
		for (pid_t p : tree_)
			kill(p, SIGKILL);
		return wait_gone(s, "after SIGKILL, to restore them from the image");
	}

	bool restore(unsigned c)
	{
		Step &s = begin(c, "restore");
		std::string dir = images(c);
		std::string pidfile = format("%s/restore-%u.pid", work_dir_.c_str(), c);
		before_restore_ = baseline();
		std::vector<std::string> env = o_.criu_env;
		if (o_.device_map)
			env.push_back("CUDA_CRIU_DEVICE_MAP=" + *o_.device_map);
		if (!run_criu(s, "restore",
			      {"restore", "-D", dir, "-d", "-L", o_.libdir, "-v4", "-o", "restore.log", "--pidfile", pidfile},
			      env, dir + "/restore.log", o_.restore_ms))
			return false;
		std::ifstream pf(pidfile);
		pid_t pid = 0;
		if (!(pf >> pid) || pid <= 0)
			return fail(s, "criu restore wrote no pid to " + pidfile, {criu_log_excerpt(dir + "/restore.log")});
		root_ = pid;
		before_restore_.when = Clock::now(); // --ready-delay counts from here
		if (!process_exists(root_))
			return fail(s, format("criu restore succeeded but pid %d does not exist", root_),
				    {criu_log_excerpt(dir + "/restore.log"), tail_of(program_log_)});
		// CRIU has exited: its restored tree is reparented here (subreaper), to be waited for.
		if (parent_of(root_) == getpid())
			program_ = Child::adopt(root_);
		std::string detail = format("pid %d restored", root_);
		if (int n = restored_cuda_processes(dir + "/restore.log"); n >= 0)
			detail += format("; the plugin restored %d CUDA process(es)", n);
		if (o_.device_map)
			detail += "; device map " + *o_.device_map;
		return ok(s, detail);
	}

	// The count in the plugin's summary line "cuda_plugin: restore: N CUDA process(es), M failed", or -1.
	static int restored_cuda_processes(const std::string &log)
	{
		int n = -1;
		for (const std::string &l : read_lines(log))
			if (size_t at = l.find("cuda_plugin: restore: "); at != std::string::npos)
				if (int v = 0; std::sscanf(l.c_str() + at, "cuda_plugin: restore: %d CUDA process", &v) == 1)
					n = v;
		return n;
	}

	bool health(unsigned c)
	{
		Step &s = begin(c, "health");
		std::string what;
		auto deadline = Clock::now() + std::chrono::milliseconds(o_.health_ms);
		if (!await_health(s, before_restore_, deadline, "restore", what) || !settle(s, what))
			return false;
		return ok(s, format("pid %d healthy after the restore: %s", root_, what.c_str()));
	}

	// ---- the end ----

	// Kills everything this program started (its descendants) and reaps it; removes the work directory
	// unless the images are to be kept. Runs once.
	void cleanup()
	{
		if (cleaned_)
			return;
		cleaned_ = true;
		program_.kill_and_reap();
		auto deadline = Clock::now() + std::chrono::milliseconds(kCleanupMs);
		for (;;) {
			std::vector<pid_t> all = tree_of(getpid());
			for (size_t i = 1; i < all.size(); i++)
				kill(all[i], SIGKILL);
			while (waitpid(-1, nullptr, WNOHANG) > 0)
				;
			if (all.size() <= 1 && waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD)
				break;
			if (Clock::now() >= deadline) {
				std::printf("warning: %zu process(es) started by the round trip did not end within %u s\n",
					    all.size() - 1, kCleanupMs / 1000);
				break;
			}
			pause_ms(kPollMs);
		}
		if (work_dir_.empty())
			return;
		if (o_.keep_images) {
			kept_ = true;
			return;
		}
		std::error_code ec;
		if (created_dir_) {
			std::filesystem::remove_all(work_dir_, ec);
		} else {
			for (const auto &entry : std::filesystem::directory_iterator(work_dir_, ec))
				std::filesystem::remove_all(entry.path(), ec);
		}
	}

	void summary(const Step *failed)
	{
		double total = seconds_since(t0_);
		if (!failed) {
			std::printf("PASS  roundtrip %s: %lu cycle(s) of dump and restore in %.2f s\n", o_.name.c_str(),
				    o_.repeat, total);
			if (o_.repeat > 1)
				for (const char *name : {"dump", "restore"})
					print_stats(name);
		} else {
			std::printf("%s  roundtrip %s: %s: %s\n", failed->cycle ? "FAIL" : "ERROR", o_.name.c_str(),
				    step_label(*failed).c_str(), failed->detail.c_str());
			if (failed->cycle == 0 && !interrupted())
				std::printf("      the round trip was not tried: nothing was checkpointed\n");
		}
		if (kept_)
			std::printf("work directory kept: %s\n", work_dir_.c_str());
		else if (failed && failed->cycle > 0)
			std::printf("work directory removed; --keep-images keeps the images and all logs\n");
	}

	void print_stats(const char *name)
	{
		std::vector<double> t;
		for (const Step &s : steps_)
			if (s.name == name && s.status == StepStatus::Ok)
				t.push_back(s.seconds);
		if (t.empty())
			return;
		std::sort(t.begin(), t.end());
		double median = t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
		std::printf("      %-8s median %.2f s, min %.2f s, max %.2f s over %zu cycles\n", name, median, t.front(),
			    t.back(), t.size());
	}

	bool write_reports(int status)
	{
		bool ok = true;
		if (!o_.json_path.empty())
			ok &= write_file(o_.json_path, json(status), "--json");
		if (!o_.junit_path.empty())
			ok &= write_file(o_.junit_path, junit(), "--junit");
		return ok;
	}

	static bool write_file(const std::string &path, const std::string &text, const char *option)
	{
		std::ofstream f(path, std::ios::binary | std::ios::trunc);
		f << text;
		f.close();
		if (!f) {
			std::printf("error: %s %s: cannot write the file\n", option, path.c_str());
			return false;
		}
		return true;
	}

	const char *result_word(int status) const
	{
		if (interrupted())
			return "interrupted";
		if (status == kExitOk)
			return "pass";
		return status == kExitFailure ? "fail" : "error";
	}

	std::string json(int status) const
	{
		JsonWriter w;
		w.begin_object();
		w.field("name", o_.name);
		w.field("result", result_word(status));
		w.field("exit_status", interrupted() ? 128 + static_cast<int>(g_signal) : status);
		w.key("command").begin_array();
		for (const std::string &a : o_.command)
			w.value(a);
		w.end_array();
		w.field("pid", static_cast<int>(root_));
		w.key("criu").begin_object().field("path", criu_).field("version", criu_version_).end_object();
		w.field("libdir", o_.libdir);
		w.key("criu_args").begin_array();
		for (const std::string &a : o_.criu_args)
			w.value(a);
		w.end_array();
		w.field("work_dir", work_dir_);
		w.field("images_kept", kept_);
		w.field("repeat", static_cast<uint64_t>(o_.repeat));
		w.field("leave_running", o_.leave_running);
		w.key("device_map");
		if (o_.device_map)
			w.value(*o_.device_map);
		else
			w.null();
		w.field("started_unix", static_cast<int64_t>(started_unix_));
		w.field("seconds", seconds_since(t0_));
		w.key("steps").begin_array();
		for (const Step &s : steps_) {
			w.begin_object();
			w.key("cycle");
			if (s.cycle)
				w.value(s.cycle);
			else
				w.null();
			w.field("step", s.name);
			w.field("result", s.status == StepStatus::Ok	     ? "ok"
					  : s.status == StepStatus::Failed ? "fail"
									   : "skipped");
			w.field("seconds", s.seconds);
			w.field("detail", s.detail);
			if (!s.hint.empty())
				w.field("hint", s.hint);
			if (s.image_bytes >= 0)
				w.field("image_bytes", s.image_bytes);
			if (s.gpu_state_bytes >= 0)
				w.field("gpu_state_bytes", s.gpu_state_bytes);
			if (s.cuda_processes >= 0)
				w.field("cuda_processes", s.cuda_processes);
			if (!s.logs.empty()) {
				w.key("log").begin_array();
				for (const LogBlock &b : s.logs) {
					w.begin_object().field("file", b.file).key("lines").begin_array();
					for (const std::string &l : b.lines)
						w.value(l);
					w.end_array().end_object();
				}
				w.end_array();
			}
			w.end_object();
		}
		w.end_array();
		w.key("failure");
		if (const Step *f = failed_step()) {
			w.begin_object();
			w.key("cycle");
			if (f->cycle)
				w.value(f->cycle);
			else
				w.null();
			w.field("step", f->name).field("message", f->detail).field("hint", f->hint).end_object();
		} else {
			w.null();
		}
		w.end_object();
		return w.str();
	}

	std::string junit() const
	{
		size_t failures = 0, skipped = 0;
		for (const Step &s : steps_) {
			failures += s.status == StepStatus::Failed;
			skipped += s.status == StepStatus::Skipped;
		}
		char stamp[32] = "";
		struct tm tm = {};
		if (gmtime_r(&started_unix_, &tm))
			std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
		char host[256] = "";
		gethostname(host, sizeof(host) - 1);
		auto attr = [](const std::string &s) { return xml_escape(s, true); };

		std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
		x += format("<testsuite name=\"%s\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" skipped=\"%zu\" "
			    "time=\"%.3f\" timestamp=\"%s\" hostname=\"%s\">\n",
			    attr("cuda-criu roundtrip " + o_.name).c_str(), steps_.size(), failures, skipped,
			    seconds_since(t0_), stamp, attr(clean_line(host)).c_str());
		x += "  <properties>\n";
		auto property = [&](const char *name, const std::string &value) {
			x += format("    <property name=\"%s\" value=\"%s\"/>\n", name, attr(clean_line(value)).c_str());
		};
		property("command", shell_join(o_.command));
		property("criu", criu_ + " " + criu_version_);
		property("libdir", o_.libdir);
		property("repeat", std::to_string(o_.repeat));
		property("leave_running", o_.leave_running ? "true" : "false");
		if (o_.device_map)
			property("device_map", *o_.device_map);
		x += "  </properties>\n";
		// JUnit viewers split a class name at its dots.
		std::string classname = "roundtrip.";
		for (char c : o_.name)
			classname += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
		for (const Step &s : steps_) {
			x += format("  <testcase classname=\"%s\" name=\"%s\" time=\"%.3f\"", attr(classname).c_str(),
				    attr(step_label(s)).c_str(), s.seconds);
			if (s.status == StepStatus::Ok) {
				x += format(">\n    <system-out>%s</system-out>\n  </testcase>\n", xml_escape(s.detail, false).c_str());
				continue;
			}
			if (s.status == StepStatus::Skipped) {
				x += ">\n    <skipped message=\"not run: an earlier step failed\"/>\n  </testcase>\n";
				continue;
			}
			std::string body = s.detail + "\n";
			if (!s.hint.empty())
				body += "hint: " + s.hint + "\n";
			for (const LogBlock &b : s.logs) {
				body += b.file + ":\n";
				for (const std::string &l : b.lines)
					body += "  " + l + "\n";
			}
			x += format(">\n    <failure message=\"%s\" type=\"%s\">%s</failure>\n  </testcase>\n",
				    attr(s.detail).c_str(), attr(s.name).c_str(), xml_escape(body, false).c_str());
		}
		x += "</testsuite>\n";
		return x;
	}

	RoundtripOptions o_;
	Clock::time_point t0_;
	Clock::time_point step_t0_;
	std::time_t started_unix_ = 0;
	std::vector<Step> steps_;
	std::string criu_;
	std::string criu_version_;
	std::string work_dir_;
	std::string program_log_;
	std::string health_out_;
	bool created_dir_ = false;
	bool kept_ = false;
	bool cleaned_ = false;
	std::unique_ptr<Regex> ready_re_;
	Child program_ = Child::adopt(-1); // the program's root while it is a child here
	pid_t root_ = 0;                   // the program's root pid (the same after a restore: no pid namespace)
	std::vector<pid_t> tree_;          // the processes of the last dump
	Baseline after_dump_;
	Baseline before_restore_;
};

// ---- the command line ----

const std::vector<OptionSpec> kSpecs = {
	{"--ready-file", true, nullptr},   {"--ready-log", true, nullptr},	 {"--ready-port", true, nullptr},
	{"--ready-delay", true, nullptr},  {"--health-cmd", true, nullptr},	 {"--criu", true, nullptr},
	{"--libdir", true, nullptr},	   {"--dir", true, nullptr},		 {"--keep-images", false, nullptr},
	{"--repeat", true, nullptr},	   {"--leave-running", false, nullptr},	 {"--require-cuda", false, nullptr},
	{"--device-map", true, nullptr},   {"--start-timeout", true, nullptr},	 {"--dump-timeout", true, nullptr},
	{"--restore-timeout", true, nullptr}, {"--health-timeout", true, nullptr}, {"--json", true, nullptr},
	{"--junit", true, nullptr},	   {"--name", true, nullptr},		 {"--settle", true, nullptr},
};

// Options that may be given more than once: every value counts.
const char *const kRepeatable[] = {"--criu-env", "--criu-arg"};

// CRIU options the round trip sets itself.
const char *const kReservedCriuArgs[] = {"-t",	       "--tree", "-D", "--images-dir", "-o", "--log-file", "-L",
					 "--libdir", "-d",     "--restore-detached", "-R", "--leave-running",
					 "--pidfile", "-W",    "--work-dir"};

bool takes_value(const std::string &name)
{
	for (const OptionSpec &s : kSpecs)
		if (name == s.name)
			return s.takes_value;
	return false;
}

struct SplitArgs {
	Args options;                                   // for parse_args
	std::vector<std::pair<std::string, std::string>> repeated; // (--criu-env, K=V), ...
	Args command;
};

// Splits the arguments into the options and the program: the program starts after "--", or at the first
// argument that is neither an option nor an option's value. Repeatable options are taken out here.
Result<SplitArgs> split_args(const Args &args)
{
	SplitArgs out;
	for (size_t i = 0; i < args.size(); i++) {
		const std::string &a = args[i];
		if (a == "--") {
			out.command.assign(args.begin() + static_cast<long>(i) + 1, args.end());
			return out;
		}
		if (a.size() < 2 || a[0] != '-') {
			out.command.assign(args.begin() + static_cast<long>(i), args.end());
			return out;
		}
		size_t eq = a.find('=');
		std::string name = a.substr(0, eq);
		bool repeatable = std::any_of(std::begin(kRepeatable), std::end(kRepeatable),
					      [&](const char *r) { return name == r; });
		if (repeatable) {
			if (eq != std::string::npos) {
				out.repeated.emplace_back(name, a.substr(eq + 1));
			} else if (i + 1 < args.size()) {
				out.repeated.emplace_back(name, args[++i]);
			} else {
				return make_error(EINVAL, "option %s needs a value", name.c_str());
			}
			continue;
		}
		out.options.push_back(a);
		if (eq == std::string::npos && takes_value(name) && i + 1 < args.size())
			out.options.push_back(args[++i]);
	}
	return out;
}

// A timeout in seconds (more than 0), in milliseconds; fallback when not given.
Result<unsigned> seconds_option(const ParsedArgs &a, const char *name, unsigned fallback)
{
	const std::string *v = a.value(name);
	if (!v)
		return fallback;
	auto ms = parse_seconds(*v);
	if (!ms)
		return std::move(ms).error().context("%s", name);
	if (*ms == 0)
		return make_error(EINVAL, "%s: must be more than 0 seconds", name);
	return *ms;
}

// The program's name, and the script's when it runs one ("python3 train.py"); an env(1) in front, with
// its NAME=VALUE arguments, is passed over.
std::string default_name(const std::vector<std::string> &command)
{
	size_t i = 0;
	if (basename_of(command[0]) == "env")
		for (i = 1; i + 1 < command.size() && (command[i][0] == '-' || command[i].find('=') != std::string::npos);)
			i += command[i] == "-u" || command[i] == "-C" ? 2 : 1; // options with a separate value
	if (i >= command.size())
		return basename_of(command[0]);
	std::string name = basename_of(command[i]);
	// A script is a path or a file name with a suffix: not an option, not a number ("sleep 5.25").
	const std::string next = i + 1 < command.size() ? command[i + 1] : std::string();
	bool script = !next.empty() && next[0] != '-' && next.find_first_of("./") != std::string::npos &&
		      std::any_of(next.begin(), next.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
	if (script)
		name += " " + basename_of(next);
	return name;
}

} // namespace

int cmd_roundtrip(const Args &args)
{
	const char *cmd = "roundtrip";
	auto split = split_args(args);
	if (!split)
		return usage_error(cmd, split.error().message());
	ParsedArgs a;
	if (auto rc = parse_command(cmd, split->options, kSpecs, a))
		return *rc;
	if (!a.positionals.empty())
		return usage_error(cmd, "unexpected '" + a.positionals[0] + "' (the program goes after --)");
	RoundtripOptions o;
	o.command = split->command;
	if (o.command.empty() || o.command[0].empty())
		return usage_error(cmd, "no program given: cuda-criu roundtrip [OPTIONS] -- CMD ARGS...");
	for (const auto &[name, value] : split->repeated) {
		if (name == "--criu-env") {
			if (value.find('=') == std::string::npos || value[0] == '=')
				return usage_error(cmd, "--criu-env '" + value + "' is not NAME=VALUE");
			o.criu_env.push_back(value);
		} else {
			for (const char *r : kReservedCriuArgs)
				if (value == r || value.rfind(std::string(r) + "=", 0) == 0)
					return usage_error(cmd, "--criu-arg " + value + ": the round trip sets that option of criu "
									       "itself");
			o.criu_args.push_back(value);
		}
	}

	int criteria = 0;
	if (const std::string *v = a.value("--ready-file")) {
		o.ready = ReadyKind::File;
		o.ready_file = *v;
		criteria++;
	}
	if (const std::string *v = a.value("--ready-log")) {
		if (auto re = Regex::compile(*v); !re)
			return usage_error(cmd, "--ready-log: " + re.error().message());
		o.ready = ReadyKind::Log;
		o.ready_log = *v;
		criteria++;
	}
	if (const std::string *v = a.value("--ready-port")) {
		auto port = parse_count(*v, 1, 65535);
		if (!port)
			return usage_error(cmd, "--ready-port: " + port.error().message());
		o.ready = ReadyKind::Port;
		o.ready_port = static_cast<uint16_t>(*port);
		criteria++;
	}
	if (const std::string *v = a.value("--ready-delay")) {
		auto ms = parse_seconds(*v);
		if (!ms)
			return usage_error(cmd, "--ready-delay: " + ms.error().message());
		o.ready = ReadyKind::Delay;
		o.ready_delay_ms = *ms;
		criteria++;
	}
	if (const std::string *v = a.value("--health-cmd"))
		o.health_cmd = *v;
	if (criteria > 1)
		return usage_error(cmd, "give one of --ready-file, --ready-log, --ready-port and --ready-delay");
	if (criteria == 0 && o.health_cmd.empty())
		return usage_error(cmd, "say how to see that the program is ready: --ready-file, --ready-log, --ready-port, "
					"--ready-delay or --health-cmd");
	if (const std::string *v = a.value("--criu"))
		o.criu = *v;
	if (const std::string *v = a.value("--libdir"))
		o.libdir = *v;
	if (const std::string *v = a.value("--dir"))
		o.dir = *v;
	if (const std::string *v = a.value("--json"))
		o.json_path = *v;
	if (const std::string *v = a.value("--junit"))
		o.junit_path = *v;
	if (const std::string *v = a.value("--device-map")) {
		if (v->empty() || v->find('=') == std::string::npos)
			return usage_error(cmd, "--device-map '" + *v + "' is not OLD=NEW[,OLD=NEW...]");
		o.device_map = *v;
	}
	if (const std::string *v = a.value("--repeat")) {
		auto n = parse_count(*v, 1, 10000);
		if (!n)
			return usage_error(cmd, "--repeat: " + n.error().message());
		o.repeat = *n;
	}
	struct {
		const char *name;
		unsigned *ms;
	} timeouts[] = {{"--start-timeout", &o.start_ms},
			{"--dump-timeout", &o.dump_ms},
			{"--restore-timeout", &o.restore_ms},
			{"--health-timeout", &o.health_ms}};
	for (auto &t : timeouts) {
		auto ms = seconds_option(a, t.name, *t.ms);
		if (!ms)
			return usage_error(cmd, ms.error().message());
		*t.ms = *ms;
	}
	if (const std::string *v = a.value("--settle")) {
		auto ms = parse_seconds(*v);
		if (!ms)
			return usage_error(cmd, "--settle: " + ms.error().message());
		o.settle_ms = *ms;
	}
	o.keep_images = a.has("--keep-images");
	o.leave_running = a.has("--leave-running");
	o.require_cuda = a.has("--require-cuda");
	const std::string *name = a.value("--name");
	o.name = name && !name->empty() ? *name : default_name(o.command);
	return Roundtrip(std::move(o)).run();
}

} // namespace cuda_criu::cli
