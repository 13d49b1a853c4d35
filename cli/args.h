// Command-line parsing shared by the commands: long options with a value ("--timeout 5" or
// "--timeout=5"), flags, positional arguments, and the value parsers (pids, seconds, device maps).
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/text.h"
#include "driver/driver.h"

namespace cuda_criu::cli {

struct OptionSpec {
	const char *name;    // "--timeout"
	bool takes_value;    // "--timeout SECONDS" vs "--json"
	const char *alias;   // another spelling ("-h" for "--help"), or nullptr
};

class ParsedArgs {
public:
	bool has(const std::string &name) const { return flags_.count(name) || values_.count(name); }
	// The value of the last occurrence of name, or nullptr when it was not given.
	const std::string *value(const std::string &name) const;

	std::vector<std::string> positionals;

private:
	friend Result<ParsedArgs> parse_args(const std::vector<std::string> &args, const std::vector<OptionSpec> &specs);
	std::set<std::string> flags_;
	std::map<std::string, std::string> values_;
};

// Parses args against specs ("--help"/"-h" is always known). "--" ends the options. Errors name the
// offending argument.
Result<ParsedArgs> parse_args(const std::vector<std::string> &args, const std::vector<OptionSpec> &specs);

// A process id: a positive decimal number.
Result<pid_t> parse_pid(const std::string &text);
// Non-negative seconds, fractions allowed, at most a day; returned in milliseconds.
using cuda_criu::parse_seconds;
// Milliseconds as cuda-checkpoint takes them: a non-negative integer, at most a day.
Result<unsigned> parse_milliseconds(const std::string &text);
// An unsigned integer in [min, max].
Result<unsigned long> parse_count(const std::string &text, unsigned long min, unsigned long max);

} // namespace cuda_criu::cli
