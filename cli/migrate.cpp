// cuda-criu migrate: a process tree moved to another host (or namespace) in one command, as migration
// tools drive CRIU: a page server on the target, a dump that streams its pages there, the rest of the
// image copied after them, the restore on the target. Every command for the target goes through a
// prefix the user gives ("ssh gpu2", "nsenter -t PID -m -p"); without one, the target is this host.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "base/clock.h"
#include "base/format.h"
#include "base/text.h"
#include "cli.h"
#include "commands.h"
#include "criu_check.h"
#include "roundtrip/criu.h"
#include "roundtrip/workdir.h"
#include "subprocess.h"

namespace cuda_criu::cli {
namespace {

struct MigrateOptions {
	pid_t pid = 0;
	std::string to;                   // the image directory on the target
	std::vector<std::string> target;  // the prefix that runs a command there; empty: this host
	std::string address = "127.0.0.1";
	std::string port = "27027";
	bool copy = false;                // --via copy: the whole image dumped here, then copied
	std::string criu, target_criu, libdir = default_libdir(), work;
	std::vector<std::string> criu_args, criu_env;
	unsigned timeout_ms = 600000;
	bool keep = false;
};

void say(const std::string &line) { std::fprintf(stderr, "cuda-criu migrate: %s\n", line.c_str()); }

double since(uint64_t t0_us) { return static_cast<double>(now_us() - t0_us) / 1e6; }

// A program the user names or relies on (ssh, nsenter, tar), found in $PATH here.
Result<std::string> find_program(const std::string &name)
{
	const char *path = std::getenv("PATH");
	std::string found = search_path(name, path ? path : "/usr/sbin:/usr/bin:/sbin:/bin");
	if (found.empty())
		return make_error(ENOENT, "%s: not found in $PATH", name.c_str());
	return found;
}

class Target {
public:
	Target(std::vector<std::string> prefix, std::string criu) : prefix_(std::move(prefix)), criu_(std::move(criu)) {}

	// argv run there: through the prefix, whose program is found in $PATH here; without a prefix the
	// program itself is found here.
	Result<std::vector<std::string>> argv(std::vector<std::string> args) const
	{
		args.insert(args.begin(), prefix_.begin(), prefix_.end());
		if (args[0].find('/') == std::string::npos) {
			auto found = find_program(args[0]);
			if (!found)
				return std::move(found).error();
			args[0] = *found;
		}
		return args;
	}

	// Runs args there; the error holds its output.
	Status run(const std::vector<std::string> &args, unsigned timeout_ms) const
	{
		auto full = argv(args);
		if (!full)
			return full.error();
		int status = 0;
		auto out = run_capture(*full, timeout_ms, status);
		if (!out)
			return out.error();
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			return make_error(EIO, "`%s` %s: %s", join(*full).c_str(), describe_wait_status(status).c_str(),
					  trim(*out).c_str());
		return {};
	}

	// CRIU there with args, with env ("NAME=value") in its environment.
	std::vector<std::string> criu_command(std::vector<std::string> args, const std::vector<std::string> &env) const
	{
		args.insert(args.begin(), criu_);
		if (!env.empty()) {
			args.insert(args.begin(), env.begin(), env.end());
			args.insert(args.begin(), "env");
		}
		return args;
	}

	static std::string join(const std::vector<std::string> &words)
	{
		std::string s;
		for (const std::string &w : words)
			s += (s.empty() ? "" : " ") + w;
		return s;
	}

private:
	std::vector<std::string> prefix_;
	std::string criu_;
};

// The files of the local image directory into the target's: tar here, piped into tar there.
Status copy_tree(const std::string &from, const Target &target, const std::string &to, unsigned timeout_ms)
{
	auto tar = find_program("tar");
	if (!tar)
		return std::move(tar).error();
	auto there = target.argv({"tar", "-C", to, "-xf", "-"});
	if (!there)
		return there.error();
	int fds[2];
	if (::pipe2(fds, O_CLOEXEC) != 0)
		return make_error(errno, "%s", "pipe");
	SpawnOptions pack;
	pack.argv = {*tar, "-C", from, "-cf", "-", "."};
	pack.stdout_fd = fds[1];
	SpawnOptions unpack;
	unpack.argv = *there;
	unpack.stdin_fd = fds[0];
	auto a = Child::spawn(pack);
	auto b = a ? Child::spawn(unpack) : Result<Child>(a.error());
	::close(fds[0]);
	::close(fds[1]);
	if (!a || !b)
		return !a ? a.error() : b.error();
	for (auto *c : {&*a, &*b}) {
		auto st = c->wait(timeout_ms);
		if (!st)
			return st.error();
		if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0)
			return make_error(EIO, "copying the image to the target: tar %s", describe_wait_status(*st).c_str());
	}
	return {};
}

int migrate(const MigrateOptions &o)
{
	Preflight pre = preflight_criu_and_plugin(o.criu, o.libdir, o.criu_env);
	if (!pre.ok) {
		say(pre.message + (pre.hint.empty() ? "" : "\n  hint: " + pre.hint));
		return 3;
	}
	Target target(o.target, o.target_criu.empty() ? pre.criu : o.target_criu);
	const char *tmp = std::getenv("TMPDIR");
	auto work = o.work.empty() ? roundtrip::WorkDir::make_temp(tmp && *tmp ? tmp : "/tmp", "cuda-criu-migrate")
				   : roundtrip::WorkDir::create(o.work);
	if (!work) {
		say(work.error().message());
		return 3;
	}
	std::string where = o.target.empty() ? "this host" : Target::join(o.target);
	if (auto st = target.run({"mkdir", "-p", o.to}, 30000); !st) {
		say(format("cannot make %s on the target (%s): %s", o.to.c_str(), where.c_str(), st.error().message().c_str()));
		return 3;
	}
	std::vector<std::string> dump_more = o.criu_args;
	if (!o.copy) {
		if (auto st = target.run(target.criu_command({"page-server", "-D", o.to, "--address", o.address, "--port",
							      o.port, "-d", "--pidfile", o.to + "/page-server.pid", "-o",
							      "page-server.log", "-v4"},
							     o.criu_env),
					 30000);
		    !st) {
			say(format("the page server did not start on the target (%s): %s", where.c_str(),
				   st.error().message().c_str()));
			return 3;
		}
		say(format("page server on the target (%s) at %s:%s, images into %s", where.c_str(), o.address.c_str(),
			   o.port.c_str(), o.to.c_str()));
		dump_more.insert(dump_more.end(), {"--page-server", "--address", o.address, "--port", o.port});
	}
	roundtrip::Criu criu({pre.criu, o.libdir, o.criu_env, {}}, *work);
	std::string images = work->file("images");
	if (auto st = work->make_dir("images"); !st) {
		say(st.error().message());
		return 3;
	}
	uint64_t t0 = now_us();
	say(format("dumping pid %d into %s%s", o.pid, images.c_str(), o.copy ? "" : " (its pages to the page server)"));
	roundtrip::CriuResult d = criu.dump(o.pid, images, "migrate", dump_more, o.timeout_ms);
	if (!d.ok) {
		if (!o.copy)
			(void)target.run({"sh", "-c", "kill $(cat " + o.to + "/page-server.pid) 2>/dev/null"}, 10000);
		say(format("%s: pid %d was not moved and runs on here, as CRIU and the plugin leave a failed dump "
			   "(work directory %s kept)", d.message.c_str(), o.pid, work->path().c_str()));
		for (const auto &block : d.logs)
			for (const std::string &line : block.lines)
				std::fprintf(stderr, "  %s\n", line.c_str());
		return 1;
	}
	double dump_s = since(t0);
	say(format("dumped in %.2f s", dump_s));
	uint64_t t1 = now_us();
	uint64_t bytes = roundtrip::tree_bytes(images);
	if (auto st = copy_tree(images, target, o.to, o.timeout_ms); !st) {
		say(format("%s; pid %d is dumped and no longer runs: its image is in %s here and (the pages) in %s on the "
			   "target; copy %s there and run `criu restore -D %s -d`",
			   st.error().message().c_str(), o.pid, images.c_str(), o.to.c_str(), images.c_str(), o.to.c_str()));
		return 1;
	}
	double copy_s = since(t1);
	say(format("copied %s of image files to the target in %.2f s", human_bytes(bytes).c_str(), copy_s));
	uint64_t t2 = now_us();
	std::vector<std::string> restore = {"restore", "-D", o.to, "-d", "-L", o.libdir, "-v4", "-o", "restore.log"};
	restore.insert(restore.end(), o.criu_args.begin(), o.criu_args.end());
	if (auto st = target.run(target.criu_command(restore, o.criu_env), o.timeout_ms); !st) {
		say(format("the restore on the target failed: %s; the image stays in %s there (its log: restore.log) "
			   "for another try with `criu restore -D %s -d`",
			   st.error().message().c_str(), o.to.c_str(), o.to.c_str()));
		return 1;
	}
	double restore_s = since(t2);
	say(format("restored on the target in %.2f s", restore_s));
	say(format("pid %d runs on the target (%s); downtime %.2f s: dump %.2f s, copy %.2f s, restore %.2f s", o.pid,
		   where.c_str(), dump_s + copy_s + restore_s, dump_s, copy_s, restore_s));
	if (!o.keep)
		work->clear();
	return 0;
}

std::vector<std::string> words(const std::string &text)
{
	std::istringstream in(text);
	std::vector<std::string> out;
	for (std::string w; in >> w;)
		out.push_back(w);
	return out;
}

} // namespace

int cmd_migrate(const Invocation &in)
{
	const ParsedArgs &a = in.args;
	MigrateOptions o;
	if (a.positionals.size() != 1)
		return usage_error("migrate", "give one PID");
	auto pid = parse_pid(a.positionals[0]);
	if (!pid)
		return usage_error("migrate", pid.error().message());
	o.pid = *pid;
	a.get("--to", o.to);
	if (o.to.empty() || o.to[0] != '/')
		return usage_error("migrate", "--to DIR, an absolute path on the target, is needed");
	if (const std::string *t = a.value("--target"))
		o.target = words(*t);
	a.get("--address", o.address);
	a.get("--port", o.port);
	if (auto p = parse_count(o.port, 1, 65535); !p)
		return usage_error("migrate", "--port: " + p.error().message());
	if (const std::string *via = a.value("--via")) {
		if (*via != "page-server" && *via != "copy")
			return usage_error("migrate", "--via takes page-server or copy");
		o.copy = *via == "copy";
	}
	a.get("--criu", o.criu);
	a.get("--target-criu", o.target_criu);
	a.get("--libdir", o.libdir);
	a.get("--dir", o.work);
	o.criu_args = a.values("--criu-arg");
	o.criu_env = a.values("--criu-env");
	if (const std::string *t = a.value("--timeout")) {
		auto ms = parse_seconds(*t);
		if (!ms)
			return usage_error("migrate", "--timeout: " + ms.error().message());
		o.timeout_ms = *ms;
	}
	o.keep = a.has("--keep");
	if (::geteuid() != 0) {
		say("needs root (CRIU does)");
		return 3;
	}
	return migrate(o);
}

} // namespace cuda_criu::cli
