// Command-line parsing shared by the commands: long options with a value ("--timeout 5" or
// "--timeout=5"), flags, repeatable options, positional arguments, and the value parsers (pids, seconds,
// counts). The options of a command come from its help page in the command table (commands.h): what is
// parsed is what is documented.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/text.h"

namespace cuda_criu::cli {

struct OptionSpec {
	std::string name;        // "--timeout"
	std::string value;       // its value in the help ("SECONDS"); empty: a flag
	std::string alias;       // another spelling ("-p" for "--pid"), or empty
	bool repeatable = false; // every value counts (values()), not the last one only
	bool shown = true;       // on the command's help page
};

class ParsedArgs {
public:
	bool has(const std::string &name) const { return flags_.count(name) || values_.count(name); }
	// The value of the last occurrence of name, or nullptr when it was not given.
	const std::string *value(const std::string &name) const;
	// Sets out to the value of name when it was given.
	void get(const std::string &name, std::string &out) const;
	// Every value of a repeatable option, in order.
	std::vector<std::string> values(const std::string &name) const;

	std::vector<std::string> positionals;

private:
	friend Result<ParsedArgs> parse_args(const std::vector<std::string> &args, const std::vector<OptionSpec> &specs,
					     bool program_follows);
	std::set<std::string> flags_;
	std::map<std::string, std::vector<std::string>> values_;
};

// Parses args against specs ("--help"/"-h" is always known). "--" ends the options. With
// program_follows, the first argument that is not an option (or one after "--") starts a program's
// command line: it and all after it are the positionals, unparsed. Errors name the offending argument.
Result<ParsedArgs> parse_args(const std::vector<std::string> &args, const std::vector<OptionSpec> &specs,
			      bool program_follows = false);

// A process id: a positive decimal number.
Result<pid_t> parse_pid(const std::string &text);
// Non-negative seconds, fractions allowed, at most a day; returned in milliseconds.
using cuda_criu::parse_seconds;
// Milliseconds as cuda-checkpoint takes them: a non-negative integer, at most a day.
Result<unsigned> parse_milliseconds(const std::string &text);
// An unsigned integer in [min, max].
Result<unsigned long> parse_count(const std::string &text, unsigned long min, unsigned long max);

} // namespace cuda_criu::cli
