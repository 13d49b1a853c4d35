// cuda-criu: the command-line companion of cuda_plugin.so. It shares the plugin's core library.
// Invoked as "cuda-checkpoint" (through a link), it takes NVIDIA cuda-checkpoint's command line.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"
#include "roundtrip.h"

#ifndef CUDA_CRIU_VERSION
#define CUDA_CRIU_VERSION "dev"
#endif

using namespace cuda_criu::cli;

namespace {

std::string basename_of(const char *path)
{
	const char *slash = std::strrchr(path, '/');
	return slash ? slash + 1 : path;
}

int dispatch(const std::string &cmd, const Args &rest)
{
	if (cmd == "help") {
		if (rest.size() > 1)
			return usage_error("help", "takes at most one command name");
		if (!rest.empty() && (rest[0] == "--help" || rest[0] == "-h"))
			return print_help("help"), kExitOk;
		if (!print_help(rest.empty() ? std::string() : rest[0]))
			return usage_error("help", "no command '" + rest[0] + "'");
		return kExitOk;
	}
	if (cmd == "check")
		return cmd_check(rest);
	if (cmd == "inspect")
		return cmd_inspect(rest);
	if (cmd == "ps")
		return cmd_ps(rest);
	if (cmd == "status")
		return cmd_status(rest);
	if (cmd == "compat")
		return cmd_compat("cuda-criu compat", rest);
	if (cmd == "selftest")
		return cmd_selftest(rest);
	if (cmd == "roundtrip")
		return cmd_roundtrip(rest);
	if (cmd == kSelftestWorkloadCommand)
		return cmd_selftest_workload(rest);
	if (is_command(cmd))
		return cmd_action(cmd, rest);
	return usage_error("", "unknown command '" + cmd + "'");
}

} // namespace

int main(int argc, char **argv)
{
	set_verbose(false);
	Args args(argv + 1, argv + argc);
	if (argc > 0 && basename_of(argv[0]) == "cuda-checkpoint")
		return cmd_compat("cuda-checkpoint", args);

	size_t i = 0;
	for (; i < args.size() && !args[i].empty() && args[i][0] == '-'; i++) {
		const std::string &a = args[i];
		if (a == "-v" || a == "--verbose") {
			set_verbose(true);
		} else if (a == "-h" || a == "--help") {
			print_help("");
			return kExitOk;
		} else if (a == "--version") {
			std::printf("cuda-criu %s\n", CUDA_CRIU_VERSION);
			return kExitOk;
		} else {
			return usage_error("", "unknown option '" + a + "'");
		}
	}
	if (i == args.size()) {
		std::fputs("usage: cuda-criu [-v] COMMAND [OPTIONS] [ARGUMENTS]; 'cuda-criu help' lists the commands.\n",
			   stderr);
		return kExitUsage;
	}
	return dispatch(args[i], Args(args.begin() + static_cast<long>(i) + 1, args.end()));
}
