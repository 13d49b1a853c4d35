// The command table: one entry per command of cuda-criu, with its handler, its options and its manual
// page. main.cpp dispatches through it, the parser takes each command's options from it, help.cpp prints
// its pages from it, and the cli_help test reads the list back (`cuda-criu help --commands`): a command
// or an option cannot be parsed without being documented. Adding a command: its entry in commands.cpp,
// its handler in its own file, its docs, CMake.
#pragma once

#include <string>
#include <vector>

#include "args.h"

namespace cuda_criu::cli {

struct Command;

// What a handler gets: its entry and its arguments, parsed against the entry's options (for
// Operands::Raw, args.positionals holds the arguments as given).
struct Invocation {
	const Command &command;
	ParsedArgs args;
};

// What a command takes besides its options.
enum class Operands {
	None,    // nothing: an argument is bad usage
	Some,    // arguments (PIDs, a directory): the handler checks them
	Program, // a program's command line: everything from the first argument that is not an option
	Raw,     // the handler parses its arguments itself, with the entry's options (compat)
};

struct Command {
	const char *name;
	int (*run)(const Invocation &);
	Operands operands;
	std::vector<OptionSpec> options;
	// The manual page: NAME line, SYNOPSIS, DESCRIPTION, then OPTIONS (from options, and -h), EXIT
	// STATUS and EXAMPLES. A command without a summary is internal: not in the overview.
	const char *summary;
	const char *synopsis;
	const char *description;
	const char *exit_status;
	const char *examples;
};

// Every command, in the order of the overview.
const std::vector<Command> &commands();
// The command called name, or nullptr.
const Command *find_command(const std::string &name);

// Parses args for c and runs it: --help prints its page, bad usage is reported; returns the exit status.
int run_command(const Command &c, const std::vector<std::string> &args);

} // namespace cuda_criu::cli
