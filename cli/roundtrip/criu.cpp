#include "roundtrip/criu.h"

#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/format.h"
#include "progress_display.h"
#include "roundtrip/processes.h"
#include "subprocess.h"

namespace cuda_criu::cli::roundtrip {

CriuResult Criu::dump(pid_t pid, const std::string &images, const std::string &tag,
		      const std::vector<std::string> &more, unsigned timeout_ms) const
{
	std::vector<std::string> args = {"dump", "-t", std::to_string(pid), "-D", images, "-L", setup_.libdir,
					  "-v4", "-o", "dump.log"};
	args.insert(args.end(), more.begin(), more.end());
	return run("dump", std::move(args), setup_.env, images + "/dump.log", tag, timeout_ms);
}

CriuResult Criu::restore(const std::string &images, const std::string &tag, const std::vector<std::string> &more,
			 const std::vector<std::string> &env_more, unsigned timeout_ms) const
{
	std::vector<std::string> args = {"restore", "-D", images, "-d", "-L", setup_.libdir, "-v4", "-o", "restore.log"};
	args.insert(args.end(), more.begin(), more.end());
	std::vector<std::string> env = setup_.env;
	env.insert(env.end(), env_more.begin(), env_more.end());
	return run("restore", std::move(args), env, images + "/restore.log", tag, timeout_ms);
}

CriuResult Criu::run(const char *action, std::vector<std::string> args, const std::vector<std::string> &env,
		     const std::string &log, const std::string &tag, unsigned timeout_ms) const
{
	CriuResult r;
	args.insert(args.begin(), setup_.path);
	args.insert(args.end(), setup_.extra_args.begin(), setup_.extra_args.end());
	std::string out_name = format("criu-%s-%s.out", action, tag.c_str());
	auto out = work_->create_file(out_name);
	if (!out) {
		r.message = format("criu %s: %s", action, out.error().message().c_str());
		return r;
	}
	// CRIU writes the log anew; an old one of this name must not show its progress lines as this run's.
	::unlink(log.c_str());
	LogFollower follow(log);
	ProgressDisplay display;
	uint64_t next_look_us = 0;
	auto show_progress = [&] {
		if (now_us() < next_look_us)
			return;
		next_look_us = now_us() + 250000;
		for (const std::string &line : follow.new_lines())
			if (auto msg = plugin_message(line); msg && is_progress_message(*msg))
				display.show(format("cuda-criu: criu %s: %s", action, clean_line(*msg).c_str()));
	};
	auto st = run_tool(args, env, out->get(), timeout_ms, show_progress);
	display.finish();
	if (!st && st.error().errno_value() == EINTR) {
		r.interrupted = true;
		return r;
	}
	r.logs = {tail_of(work_->file(out_name)), criu_log_excerpt(log)};
	if (!st) {
		r.message = format("criu %s %s", action, st.error().message().c_str());
		r.timed_out = st.error().errno_value() == ETIMEDOUT;
		return r;
	}
	if (!WIFEXITED(*st) || WEXITSTATUS(*st) != 0) {
		r.message = format("criu %s %s", action, describe_wait_status(*st).c_str());
		return r;
	}
	r.ok = true;
	return r;
}

} // namespace cuda_criu::cli::roundtrip
