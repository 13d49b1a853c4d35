// The command table: one entry per command of cuda-criu, with its handler and its manual page. Its
// options are read from the page's OPTIONS text, so that what is parsed is what is documented: main.cpp
// dispatches through the table, the parser takes each command's options from it, help.cpp prints its
// pages, and the cli_help test reads it back (`cuda-criu help --commands`). Adding a command: its entry
// in commands.cpp, its handler in its own file, its docs, CMake.
#pragma once

#include <span>
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
	// The manual page: NAME line (summary), SYNOPSIS ("cuda-criu NAME", the options, then synopsis; for
	// Operands::Raw synopsis alone), DESCRIPTION, OPTIONS, EXIT STATUS and EXAMPLES. A command without a
	// summary is internal: not in the overview, no page.
	const char *summary;
	const char *synopsis;
	const char *description;
	// One option per line that starts with '-': "--name VALUE  help" or "-a, --name  help", the help
	// from column 18 on and on the lines below ("(repeatable)" in it: every value counts); a label of 18
	// columns or more has its help on the next line.
	const char *options;
	const char *exit_status;
	const char *examples;
	// Options in the same form that are parsed but not shown on the page.
	const char *hidden_options = nullptr;
};

// Every command, in the order of the overview.
std::span<const Command> commands();
// The command called name, or nullptr.
const Command *find_command(const std::string &name);
// The options of c, read from its page (OptionSpec::shown) and its hidden options.
const std::vector<OptionSpec> &options_of(const Command &c);

// Parses args for c and runs it: --help prints its page, bad usage is reported; returns the exit status.
int run_command(const Command &c, const std::vector<std::string> &args);

} // namespace cuda_criu::cli
