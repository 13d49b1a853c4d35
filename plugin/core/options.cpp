#include "core/options.h"

#include <cmath>
#include <cstdlib>
#include <fstream>

extern char **environ;

namespace cuda_criu {
namespace {

struct Key {
	const char *name; // in the config file; the variable is CUDA_CRIU_ + upper case, '-' -> '_'
	Status (*apply)(Options &, const std::string &);
};

Result<unsigned> parse_seconds(const std::string &value)
{
	char *end = nullptr;
	double s = std::strtod(value.c_str(), &end);
	if (value.empty() || *end != '\0' || !std::isfinite(s) || s < 0 || s > 86400)
		return make_error(EINVAL, "'%s' is not a number of seconds (0 to 86400)", value.c_str());
	return static_cast<unsigned>(std::lround(s * 1000));
}

Status set_ms(unsigned &slot, const std::string &value)
{
	auto ms = parse_seconds(value);
	if (!ms)
		return std::move(ms).error();
	slot = *ms;
	return {};
}

const Key kKeys[] = {
	{"lock-timeout", [](Options &o, const std::string &v) { return set_ms(o.lock_timeout_ms, v); }},
	{"checkpoint-timeout", [](Options &o, const std::string &v) { return set_ms(o.checkpoint_timeout_ms, v); }},
	{"restore-timeout", [](Options &o, const std::string &v) { return set_ms(o.restore_timeout_ms, v); }},
	{"parallel",
	 [](Options &o, const std::string &v) -> Status {
		 char *end = nullptr;
		 long n = std::strtol(v.c_str(), &end, 10);
		 if (v.empty() || *end != '\0' || n < 0 || n > 4096)
			 return make_error(EINVAL, "'%s' is not a count (0 = all at once)", v.c_str());
		 o.parallel = static_cast<unsigned>(n);
		 return {};
	 }},
	{"libcuda",
	 [](Options &o, const std::string &v) -> Status {
		 o.libcuda = v;
		 return {};
	 }},
	{"device-map",
	 [](Options &o, const std::string &v) -> Status {
		 o.device_map = v;
		 return {};
	 }},
	{"map-image",
	 [](Options &o, const std::string &v) -> Status {
		 if (v != "auto" && v != "off")
			 return make_error(EINVAL, "'%s' is neither auto nor off", v.c_str());
		 o.map_image = v == "auto";
		 return {};
	 }},
};

std::string env_name(const char *key)
{
	std::string s = "CUDA_CRIU_";
	for (const char *p = key; *p; p++)
		s += *p == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
	return s;
}

Status apply(Options &o, const std::string &key, const std::string &value, const std::string &where)
{
	for (const Key &k : kKeys)
		if (key == k.name) {
			if (auto st = k.apply(o, value); !st)
				return std::move(st).error().context("%s: %s", where.c_str(), key.c_str());
			return {};
		}
	return make_error(EINVAL, "%s: unknown option '%s'", where.c_str(), key.c_str());
}

std::string trim(const std::string &s)
{
	size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
	return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

} // namespace

Result<Options> load_options(const std::map<std::string, std::string> &env)
{
	Options o;
	auto it = env.find("CUDA_CRIU_CONFIG");
	std::string path = it != env.end() ? it->second : kDefaultConfigFile;
	std::ifstream f(path);
	if (f) {
		o.config_file = path;
		std::string line;
		for (int n = 1; std::getline(f, line); n++) {
			line = trim(line.substr(0, line.find('#')));
			if (line.empty())
				continue;
			size_t eq = line.find('=');
			if (eq == std::string::npos)
				return make_error(EINVAL, "%s:%d: expected key=value, got '%s'", path.c_str(), n, line.c_str());
			std::string key = trim(line.substr(0, eq));
			if (key.rfind("cuda.", 0) == 0) // CRIU's proposed per-plugin option form: cuda.device-map=...
				key = key.substr(5);
			if (auto st = apply(o, key, trim(line.substr(eq + 1)), format("%s:%d", path.c_str(), n)); !st)
				return std::move(st).error();
		}
	} else if (it != env.end()) {
		return make_error(ENOENT, "cannot read CUDA_CRIU_CONFIG=%s", path.c_str());
	}
	for (const Key &k : kKeys) {
		auto e = env.find(env_name(k.name));
		if (e != env.end())
			if (auto st = apply(o, k.name, e->second, "environment " + e->first); !st)
				return std::move(st).error();
	}
	return o;
}

Result<Options> load_options_from_environment()
{
	std::map<std::string, std::string> env;
	for (char **e = environ; e && *e; e++) {
		std::string kv = *e;
		if (kv.rfind("CUDA_CRIU_", 0) != 0)
			continue;
		size_t eq = kv.find('=');
		env[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
	}
	return load_options(env);
}

} // namespace cuda_criu
