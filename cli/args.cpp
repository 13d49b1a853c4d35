#include "args.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>

namespace cuda_criu::cli {
namespace {

constexpr double kMaxSeconds = 86400;

bool all_digits(const std::string &s)
{
	if (s.empty())
		return false;
	for (char c : s)
		if (c < '0' || c > '9')
			return false;
	return true;
}

} // namespace

const std::string *ParsedArgs::value(const std::string &name) const
{
	auto it = values_.find(name);
	return it == values_.end() ? nullptr : &it->second.back();
}

void ParsedArgs::get(const std::string &name, std::string &out) const
{
	if (const std::string *v = value(name))
		out = *v;
}

std::vector<std::string> ParsedArgs::values(const std::string &name) const
{
	auto it = values_.find(name);
	return it == values_.end() ? std::vector<std::string>() : it->second;
}

Result<ParsedArgs> parse_args(const std::vector<std::string> &args, const std::vector<OptionSpec> &specs,
			      bool program_follows)
{
	std::vector<OptionSpec> all = specs;
	all.push_back({"--help", "", "-h"});
	ParsedArgs out;
	bool options_done = false;
	for (size_t i = 0; i < args.size(); i++) {
		const std::string &a = args[i];
		if (options_done || a.size() < 2 || a[0] != '-' || (!program_follows && all_digits(a.substr(1)))) {
			if (program_follows) {
				out.positionals.assign(args.begin() + static_cast<long>(i), args.end());
				break;
			}
			out.positionals.push_back(a);
			continue;
		}
		if (a == "--") {
			options_done = true;
			continue;
		}
		std::string name = a, inline_value;
		bool has_inline = false;
		if (size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
			name = a.substr(0, eq);
			inline_value = a.substr(eq + 1);
			has_inline = true;
		}
		const OptionSpec *spec = nullptr;
		for (const OptionSpec &s : all)
			if (name == s.name || (!s.alias.empty() && name == s.alias))
				spec = &s;
		if (!spec)
			return make_error(EINVAL, "unknown option '%s'", a.c_str());
		if (spec->value.empty()) {
			if (has_inline)
				return make_error(EINVAL, "option %s takes no value", spec->name.c_str());
			out.flags_.insert(spec->name);
			continue;
		}
		if (!has_inline) {
			if (i + 1 >= args.size())
				return make_error(EINVAL, "option %s needs a value", spec->name.c_str());
			inline_value = args[++i];
		}
		std::vector<std::string> &values = out.values_[spec->name];
		if (!spec->repeatable)
			values.clear();
		values.push_back(inline_value);
	}
	return out;
}

Result<pid_t> parse_pid(const std::string &text)
{
	errno = 0;
	char *end = nullptr;
	long v = std::strtol(text.c_str(), &end, 10);
	if (!all_digits(text) || errno || v <= 0 || v > INT_MAX)
		return make_error(EINVAL, "'%s' is not a process id", text.c_str());
	return static_cast<pid_t>(v);
}

Result<unsigned> parse_milliseconds(const std::string &text)
{
	auto v = parse_count(text, 0, static_cast<unsigned long>(kMaxSeconds * 1000));
	if (!v)
		return make_error(EINVAL, "'%s' is not a number of milliseconds (0 to %.0f)", text.c_str(),
				  kMaxSeconds * 1000);
	return static_cast<unsigned>(*v);
}

Result<unsigned long> parse_count(const std::string &text, unsigned long min, unsigned long max)
{
	errno = 0;
	char *end = nullptr;
	unsigned long v = std::strtoul(text.c_str(), &end, 10);
	if (!all_digits(text) || errno || v < min || v > max)
		return make_error(EINVAL, "'%s' is not a whole number from %lu to %lu", text.c_str(), min, max);
	return v;
}

} // namespace cuda_criu::cli
