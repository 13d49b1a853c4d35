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
	return it == values_.end() ? nullptr : &it->second;
}

Result<ParsedArgs> parse_args(const std::vector<std::string> &args, const std::vector<OptionSpec> &specs)
{
	std::vector<OptionSpec> all = specs;
	all.push_back({"--help", false, "-h"});
	ParsedArgs out;
	bool options_done = false;
	for (size_t i = 0; i < args.size(); i++) {
		const std::string &a = args[i];
		if (options_done || a.size() < 2 || a[0] != '-' || all_digits(a.substr(1))) {
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
			if (name == s.name || (s.alias && name == s.alias))
				spec = &s;
		if (!spec)
			return make_error(EINVAL, "unknown option '%s'", a.c_str());
		if (!spec->takes_value) {
			if (has_inline)
				return make_error(EINVAL, "option %s takes no value", spec->name);
			out.flags_.insert(spec->name);
			continue;
		}
		if (!has_inline) {
			if (i + 1 >= args.size())
				return make_error(EINVAL, "option %s needs a value", spec->name);
			inline_value = args[++i];
		}
		out.values_[spec->name] = inline_value;
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

Result<std::vector<GpuPair>> parse_device_map(const std::string &text,
					       const std::function<Result<std::vector<GpuInfo>>()> &list_gpus)
{
	std::vector<GpuInfo> gpus; // listed at the first index
	bool listed = false;
	auto uuid_of = [&](const std::string &key) -> Result<GpuUuid> {
		if (!all_digits(key))
			return GpuUuid::parse(key);
		if (!listed) {
			auto l = list_gpus();
			if (!l)
				return std::move(l).error().context("%s", "GPU indices need the driver's GPU list");
			gpus = std::move(*l);
			listed = true;
		}
		for (const GpuInfo &g : gpus)
			if (std::to_string(g.ordinal) == key)
				return g.uuid;
		return make_error(ENODEV, "there is no GPU %s here (%zu GPU(s))", key.c_str(), gpus.size());
	};
	std::vector<GpuPair> pairs;
	size_t start = 0;
	while (start <= text.size() && !text.empty()) {
		size_t comma = text.find(',', start);
		std::string entry = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
		start = comma == std::string::npos ? text.size() + 1 : comma + 1;
		size_t eq = entry.find('=');
		if (eq == std::string::npos)
			return make_error(EINVAL, "device map '%s': entry '%s' is not OLD=NEW", text.c_str(), entry.c_str());
		std::string from = entry.substr(0, eq), to = entry.substr(eq + 1);
		auto old_uuid = uuid_of(from);
		if (!old_uuid)
			return std::move(old_uuid).error().context("device map '%s'", text.c_str());
		auto new_uuid = uuid_of(to);
		if (!new_uuid)
			return std::move(new_uuid).error().context("device map '%s'", text.c_str());
		for (const GpuPair &p : pairs)
			if (p.from == *old_uuid)
				return make_error(EINVAL, "device map '%s': %s is mapped twice", text.c_str(),
						  old_uuid->str().c_str());
		pairs.push_back({*old_uuid, *new_uuid});
	}
	return pairs;
}

} // namespace cuda_criu::cli
