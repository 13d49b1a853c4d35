#include "core/options.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "base/text.h"
#include "image/chunk_codec.h"

namespace cuda_criu {
namespace {

struct Key {
	const char *name; // in the config file; the variable is CUDA_CRIU_ + upper case, '-' -> '_'
	Status (*apply)(Options &, const std::string &);
};

Status set_ms(unsigned &slot, const std::string &value)
{
	auto ms = parse_seconds(value);
	if (!ms)
		return std::move(ms).error();
	slot = *ms;
	return {};
}

Status set_level(CheckLevel &slot, const std::string &value)
{
	if (value == "error")
		slot = CheckLevel::Refuse;
	else if (value == "warn")
		slot = CheckLevel::Warn;
	else if (value == "off")
		slot = CheckLevel::Off;
	else
		return make_error(EINVAL, "'%s' is not one of error, warn, off", value.c_str());
	return {};
}

// auto (true) or off (false).
Status set_auto_off(bool &slot, const std::string &v)
{
	if (v != "auto" && v != "off")
		return make_error(EINVAL, "'%s' is neither auto nor off", v.c_str());
	slot = v == "auto";
	return {};
}

// what: names the value in the error ("'x' is not WHAT").
Status set_count(unsigned &slot, const std::string &value, long max, const char *what)
{
	char *end = nullptr;
	long n = std::strtol(value.c_str(), &end, 10);
	if (value.empty() || *end != '\0' || n < 0 || n > max)
		return make_error(EINVAL, "'%s' is not %s", value.c_str(), what);
	slot = static_cast<unsigned>(n);
	return {};
}

const Key kKeys[] = {
	{"lock-timeout", [](Options &o, const std::string &v) { return set_ms(o.lock_timeout_ms, v); }},
	{"checkpoint-timeout", [](Options &o, const std::string &v) { return set_ms(o.checkpoint_timeout_ms, v); }},
	{"restore-timeout", [](Options &o, const std::string &v) { return set_ms(o.restore_timeout_ms, v); }},
	{"stall-timeout", [](Options &o, const std::string &v) { return set_ms(o.stall_timeout_ms, v); }},
	{"memory-check", [](Options &o, const std::string &v) { return set_level(o.memory_check, v); }},
	{"space-check", [](Options &o, const std::string &v) { return set_level(o.space_check, v); }},
	{"parallel",
	 [](Options &o, const std::string &v) { return set_count(o.parallel, v, 4096, "a count (0 = all at once)"); }},
	{"libcuda",
	 [](Options &o, const std::string &v) -> Status {
		 // The plugin runs as root inside CRIU: a relative name would be looked up from whatever
		 // directory CRIU runs in.
		 if (!v.empty() && v[0] != '/')
			 return make_error(EINVAL, "'%s' is not an absolute path: name libcuda.so.1 by its full path "
					   "(e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.1), or leave it unset for the "
					   "loader's search", v.c_str());
		 o.libcuda = v;
		 return {};
	 }},
	{"device-map",
	 [](Options &o, const std::string &v) -> Status {
		 auto map = DeviceMap::parse(v);
		 if (!map)
			 return std::move(map).error();
		 o.device_map = std::move(*map);
		 return {};
	 }},
	{"gpu-image",
	 [](Options &o, const std::string &v) -> Status {
		 if (v != "plugin" && v != "criu")
			 return make_error(EINVAL, "'%s' is neither plugin nor criu", v.c_str());
		 o.gpu_image = v == "plugin" ? GpuImage::Plugin : GpuImage::Criu;
		 return {};
	 }},
	{"io-threads",
	 [](Options &o, const std::string &v) {
		 return set_count(o.io_threads, v, 256, "a count of threads (0 = as many as useful, up to 16)");
	 }},
	{"huge-pages", [](Options &o, const std::string &v) { return set_auto_off(o.huge_pages, v); }},
	{"map-image", [](Options &o, const std::string &v) { return set_auto_off(o.map_image, v); }},
	{"write-while-dumping", [](Options &o, const std::string &v) { return set_auto_off(o.write_while_dumping, v); }},
	{"ledger",
	 [](Options &o, const std::string &v) -> Status {
		 if (v.size() < 2 || v[0] != '/' || v.back() == '/')
			 return make_error(EINVAL, "'%s' is not the absolute path of a file", v.c_str());
		 o.ledger = v;
		 return {};
	 }},
	{"compress",
	 [](Options &o, const std::string &v) -> Status {
		 if (v == "off" || v == "zstd") {
			 o.zstd_level = v == "off" ? 0 : kDefaultZstdLevel;
			 return {};
		 }
		 char *end = nullptr;
		 long level = v.rfind("zstd:", 0) == 0 ? std::strtol(v.c_str() + 5, &end, 10) : 0;
		 if (!end || end == v.c_str() + 5 || *end != '\0' || level < 1 || level > kMaxZstdLevel)
			 return make_error(EINVAL, "'%s' is not off, zstd or zstd:LEVEL (LEVEL 1 to %d)", v.c_str(),
					   kMaxZstdLevel);
		 o.zstd_level = static_cast<int>(level);
		 return {};
	 }},
	{"ledger-timeout",
	 [](Options &o, const std::string &v) -> Status {
		 // A restore holds the lock for milliseconds: a long wait only lets someone else's lock stall restores.
		 auto ms = parse_seconds(v);
		 if (!ms || *ms > 60000)
			 return make_error(EINVAL, "'%s' is not a number of seconds from 0 (one try) to 60", v.c_str());
		 o.ledger_timeout_ms = *ms;
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

// The config file tells root's CRIU which library to load: only root or the caller may be able to
// change it. /dev/null stands for "no file".
Status check_config_file(const std::string &path, const struct stat &st)
{
	if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3))
		return {};
	if (!S_ISREG(st.st_mode))
		return make_error(EINVAL, "config file %s is not a regular file", path.c_str());
	uid_t me = geteuid();
	if (st.st_uid != 0 && st.st_uid != me)
		return make_error(EPERM,
				  "config file %s is owned by uid %u, neither root nor the caller (uid %u): it could "
				  "make CRIU load any library; run chown root %s",
				  path.c_str(), static_cast<unsigned>(st.st_uid), static_cast<unsigned>(me), path.c_str());
	if (st.st_mode & (S_IWGRP | S_IWOTH))
		return make_error(EPERM,
				  "config file %s has mode %04o: writable by %s, it could make CRIU load any library; "
				  "run chmod go-w %s",
				  path.c_str(), static_cast<unsigned>(st.st_mode & 07777),
				  st.st_mode & S_IWOTH ? "anyone" : "its group", path.c_str());
	return {};
}

} // namespace

Result<Options> load_options(const std::map<std::string, std::string> &env)
{
	Options o;
	auto it = env.find("CUDA_CRIU_CONFIG");
	std::string path = it != env.end() ? it->second : kDefaultConfigFile;
	struct stat st {};
	auto text = read_small_file(path, 1 << 16, &st);
	if (text) {
		if (auto ok = check_config_file(path, st); !ok)
			return std::move(ok).error();
		o.config_file = path;
		std::istringstream f(*text);
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
		return std::move(text).error().context("cannot read the config file (CUDA_CRIU_CONFIG=%s)", path.c_str());
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
