// The manual: an overview and one page per command of the command table (commands.cpp), printed by
// `cuda-criu help [COMMAND]` and `cuda-criu COMMAND --help`.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.h"
#include "commands.h"

namespace cuda_criu::cli {
namespace {

const char kOverview[] = R"(NAME
    cuda-criu - checkpoint and restore NVIDIA CUDA processes with CRIU and cuda_plugin.so

SYNOPSIS
    cuda-criu [-v] COMMAND [OPTIONS] [ARGUMENTS]
    cuda-criu help [COMMAND]
    cuda-checkpoint OPTIONS      (NVIDIA cuda-checkpoint compatible; see `cuda-criu help compat`)

DESCRIPTION
    cuda-criu is the command-line companion of cuda_plugin.so, the CRIU plugin that checkpoints and
    restores the GPU state of CUDA processes through the NVIDIA driver's checkpoint API. It is built
    from the same code as the plugin: the same driver layer (libcuda.so.1, loaded at run time), the
    same options and the same image format.

    Before a checkpoint, `check` tells whether this machine can do it and `ps` lists the CUDA
    processes. `lock`, `checkpoint`, `restore`, `unlock`, `suspend` and `resume` move a process
    through the driver's states by hand, and `status` shows where it is. After a dump, `inspect`
    shows what the plugin stored in the image, and `inspect --verify` checks that a copy of it is
    whole. `selftest` runs the whole stack end to end, and `roundtrip` checks that your own program
    survives a checkpoint and restore (for CI).

    The driver's states of a CUDA process, and the commands between them:

        running --lock--> locked --checkpoint--> checkpointed --restore--> locked --unlock--> running

    "failed" means a driver operation failed in a way that leaves the process unusable.

COMMANDS
)";

const char kOverviewEnd[] = R"(
GLOBAL OPTIONS
    -v, --verbose     also print the driver layer's debug messages on stderr
    --version         print the version and exit
    -h, --help        print this overview; `cuda-criu COMMAND --help` prints a command's page

ENVIRONMENT
    CUDA_CRIU_LIBCUDA        the NVIDIA driver library to load (default: libcuda.so.1 through the
                             loader's search path)
    CUDA_CRIU_CONFIG         the plugin's option file (default /etc/criu/cuda_plugin.conf)
    CUDA_CRIU_LOCK_TIMEOUT, CUDA_CRIU_CHECKPOINT_TIMEOUT, CUDA_CRIU_RESTORE_TIMEOUT
                             the plugin's timeouts in seconds; with the option file, they are this
                             program's default timeouts too

EXIT STATUS
    0 on success, 1 when a check or an operation failed, 2 on bad usage. Each command's page says more.

EXAMPLES
    cuda-criu check                      # can this machine checkpoint CUDA processes?
    cuda-criu ps                         # which processes use CUDA, and in which state?
    cuda-criu suspend 4242               # free the GPUs of process 4242, keep its state
    cuda-criu resume 4242                # and bring it back
    criu dump -t 4242 -D img && cuda-criu inspect img
    cuda-criu selftest                   # the whole stack, end to end
    cuda-criu roundtrip --ready-file F -- ./app --state F   # does my program survive a restore?

SEE ALSO
    criu(8), docs/cli.md
)";

void print_indented(const char *text, const char *indent)
{
	const char *p = text;
	while (*p) {
		const char *nl = std::strchr(p, '\n');
		size_t len = nl ? static_cast<size_t>(nl - p) : std::strlen(p);
		if (len)
			std::printf("%s%.*s\n", indent, static_cast<int>(len), p);
		else
			std::printf("\n");
		p += len + (nl ? 1 : 0);
	}
}

// A command with a page (not an internal one).
const Command *find_page(const std::string &name)
{
	const Command *c = find_command(name);
	return c && c->summary ? c : nullptr;
}

std::string synopsis(const Command &c)
{
	std::string s = std::string("cuda-criu ") + c.name;
	if (c.operands == Operands::Raw)
		return s + " " + c.synopsis;
	std::string options;
	size_t shown = 0;
	for (const OptionSpec &o : options_of(c))
		if (o.shown) {
			options += " [" + o.name + (o.value.empty() ? "" : " " + o.value) + "]";
			shown++;
		}
	// A command of many options has them on its page only.
	s += shown > 8 ? " [OPTIONS]" : options;
	return *c.synopsis ? s + " " + c.synopsis : s;
}

void print_page(const Command &c)
{
	std::printf("NAME\n    cuda-criu %s - %s\n\nSYNOPSIS\n", c.name, c.summary);
	print_indented(synopsis(c).c_str(), "    ");
	std::printf("\nDESCRIPTION\n");
	print_indented(c.description, "    ");
	std::printf("\nOPTIONS\n");
	if (c.options)
		print_indented(c.options, "    ");
	print_indented("-h, --help        print this page", "    ");
	std::printf("\nEXIT STATUS\n");
	print_indented(c.exit_status, "    ");
	std::printf("\nEXAMPLES\n");
	print_indented(c.examples, "    ");
}

} // namespace

bool print_help(const std::string &command)
{
	if (command.empty()) {
		std::fputs(kOverview, stdout);
		for (const Command &c : commands())
			if (c.summary)
				std::printf("    %-12s%s\n", c.name, c.summary);
		std::fputs(kOverviewEnd, stdout);
		return true;
	}
	const Command *c = find_page(command);
	if (!c)
		return false;
	print_page(*c);
	return true;
}

int cmd_help(const Invocation &in)
{
	const ParsedArgs &a = in.args;
	if (a.has("--commands")) {
		// Each command with a page and the options it takes: what the cli_help test checks the pages against.
		for (const Command &c : commands()) {
			if (!c.summary)
				continue;
			std::printf("%s", c.name);
			for (const OptionSpec &o : options_of(c))
				if (o.shown)
					std::printf(" %s", o.name.c_str());
			std::printf("\n");
		}
		return kExitOk;
	}
	if (a.positionals.size() > 1)
		return usage_error("help", "takes at most one command name");
	if (!print_help(a.positionals.empty() ? std::string() : a.positionals[0]))
		return usage_error("help", "no command '" + a.positionals[0] + "'");
	return kExitOk;
}

void print_compat_help(const std::string &program)
{
	std::printf(R"(%s: checkpoint and restore the CUDA state of a process (cuda-criu, NVIDIA
cuda-checkpoint compatible command line)

Usage:
    %s --action ACTION --pid PID [--timeout MS] [--device-map OLD=NEW,...]
        Run one step of the checkpoint state machine. ACTION is one of
            lock        block new CUDA calls and wait for work in flight (running -> locked);
                        --timeout MS bounds the wait
            checkpoint  move the GPU state into host memory (locked -> checkpointed)
            restore     move it back onto GPUs (checkpointed -> locked); --device-map restores
                        onto other GPUs, given by UUID (GPU-...)
            unlock      let CUDA calls proceed (locked -> running)

    %s --toggle --pid PID [--timeout MS] [--device-map OLD=NEW,...]
        running -> lock and checkpoint; checkpointed -> restore and unlock.

    %s --get-state --pid PID
        Print the CUDA state of the process: running, locked, checkpointed or failed.

    %s --get-restore-tid --pid PID
        Print the id of the thread the driver uses to restore the process.

    %s --help
        Print this text. `cuda-criu help` has the full manual.

Exit status: 0 on success; 1 when the operation failed (the reason is on stderr); 2 on bad usage.
)",
		    program.c_str(), program.c_str(), program.c_str(), program.c_str(), program.c_str(),
		    program.c_str());
}

} // namespace cuda_criu::cli
