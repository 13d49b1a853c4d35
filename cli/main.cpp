// cuda-criu: the command-line companion of cuda_plugin.so. It shares the plugin's core library.
// Invoked as "cuda-checkpoint" (through a link), it takes NVIDIA cuda-checkpoint's command line.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"
#include "commands.h"

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
	const Command *c = find_command(args[i]);
	if (!c)
		return usage_error("", "unknown command '" + args[i] + "'");
	return run_command(*c, Args(args.begin() + static_cast<long>(i) + 1, args.end()));
}
