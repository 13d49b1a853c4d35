#include "roundtrip/options.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "cli.h"
#include "criu_info.h"

namespace cuda_criu::cli::roundtrip {
namespace {


constexpr const char *kCommand = "roundtrip";

// CRIU options the round trip sets itself.
const char *const kReservedCriuArgs[] = {"-t",	       "--tree", "-D", "--images-dir", "-o", "--log-file", "-L",
					 "--libdir", "-d",     "--restore-detached", "-R", "--leave-running",
					 "--pidfile", "-W",    "--work-dir"};

// A time in seconds, in milliseconds, at least min_ms; fallback when not given. Every time option of the
// round trip is read here.
Result<unsigned> seconds_option(const ParsedArgs &a, const char *name, unsigned fallback, unsigned min_ms = 0)
{
	const std::string *v = a.value(name);
	if (!v)
		return fallback;
	auto ms = parse_seconds(*v);
	if (!ms)
		return std::move(ms).error().context("%s", name);
	if (*ms < min_ms)
		return make_error(EINVAL, "%s: must be more than 0 seconds", name);
	return *ms;
}

std::string basename_of(const std::string &path)
{
	size_t slash = path.rfind('/');
	return slash == std::string::npos ? path : path.substr(slash + 1);
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

std::optional<int> parse_repeated(const ParsedArgs &a, RoundtripOptions &o)
{
	for (const std::string &value : a.values("--criu-env")) {
		if (value.find('=') == std::string::npos || value[0] == '=')
			return usage_error(kCommand, "--criu-env '" + value + "' is not NAME=VALUE");
		o.criu_env.push_back(value);
	}
	for (const std::string &value : a.values("--criu-arg")) {
		for (const char *r : kReservedCriuArgs)
			if (value == r || value.rfind(std::string(r) + "=", 0) == 0)
				return usage_error(kCommand, "--criu-arg " + value + ": the round trip sets that option of criu itself");
		o.criu_args.push_back(value);
	}
	return std::nullopt;
}

std::optional<int> parse_ready(const ParsedArgs &a, RoundtripOptions &o)
{
	int criteria = 0;
	ReadySpec &r = o.ready;
	if (const std::string *v = a.value("--ready-file")) {
		r.kind = ReadyKind::File;
		r.file = *v;
		criteria++;
	}
	if (const std::string *v = a.value("--ready-log")) {
		if (auto re = Regex::compile(*v); !re)
			return usage_error(kCommand, "--ready-log: " + re.error().message());
		r.kind = ReadyKind::Log;
		r.log_pattern = *v;
		criteria++;
	}
	if (const std::string *v = a.value("--ready-port")) {
		auto port = parse_count(*v, 1, 65535);
		if (!port)
			return usage_error(kCommand, "--ready-port: " + port.error().message());
		r.kind = ReadyKind::Port;
		r.port = static_cast<uint16_t>(*port);
		criteria++;
	}
	if (a.value("--ready-delay")) {
		auto ms = seconds_option(a, "--ready-delay", 0);
		if (!ms)
			return usage_error(kCommand, ms.error().message());
		r.kind = ReadyKind::Delay;
		r.delay_ms = *ms;
		criteria++;
	}
	if (const std::string *v = a.value("--health-cmd"))
		o.health_cmd = *v;
	if (criteria > 1)
		return usage_error(kCommand, "give one of --ready-file, --ready-log, --ready-port and --ready-delay");
	if (criteria == 0 && o.health_cmd.empty())
		return usage_error(kCommand, "say how to see that the program is ready: --ready-file, --ready-log, "
					     "--ready-port, --ready-delay or --health-cmd");
	return std::nullopt;
}

std::optional<int> parse_times(const ParsedArgs &a, RoundtripOptions &o)
{
	if (const std::string *v = a.value("--repeat")) {
		auto n = parse_count(*v, 1, 10000);
		if (!n)
			return usage_error(kCommand, "--repeat: " + n.error().message());
		o.repeat = *n;
	}
	struct {
		const char *name;
		unsigned *ms;
		unsigned min_ms;
	} times[] = {{"--start-timeout", &o.start_ms, 1},
		     {"--dump-timeout", &o.dump_ms, 1},
		     {"--restore-timeout", &o.restore_ms, 1},
		     {"--health-timeout", &o.health_ms, 1},
		     {"--settle", &o.settle_ms, 0}};
	for (auto &t : times) {
		auto ms = seconds_option(a, t.name, *t.ms, t.min_ms);
		if (!ms)
			return usage_error(kCommand, ms.error().message());
		*t.ms = *ms;
	}
	return std::nullopt;
}

void parse_paths(const ParsedArgs &a, RoundtripOptions &o)
{
	a.get("--criu", o.criu);
	a.get("--libdir", o.libdir);
	a.get("--dir", o.dir);
	a.get("--json", o.json_path);
	a.get("--junit", o.junit_path);
}

} // namespace

std::optional<int> parse_roundtrip_options(const ParsedArgs &a, RoundtripOptions &o)
{
	o.command = a.positionals;
	if (o.command.empty() || o.command[0].empty())
		return usage_error(kCommand, "no program given: cuda-criu roundtrip [OPTIONS] -- CMD ARGS...");
	if (auto rc = parse_repeated(a, o))
		return rc;
	if (auto rc = parse_ready(a, o))
		return rc;
	o.libdir = default_libdir();
	parse_paths(a, o);
	if (const std::string *v = a.value("--device-map")) {
		if (v->empty() || v->find('=') == std::string::npos)
			return usage_error(kCommand, "--device-map '" + *v + "' is not OLD=NEW[,OLD=NEW...]");
		o.device_map = *v;
	}
	if (auto rc = parse_times(a, o))
		return rc;
	o.keep_images = a.has("--keep-images");
	o.leave_running = a.has("--leave-running");
	o.require_cuda = a.has("--require-cuda");
	const std::string *name = a.value("--name");
	o.name = name && !name->empty() ? *name : default_name(o.command);
	return std::nullopt;
}

} // namespace cuda_criu::cli::roundtrip
