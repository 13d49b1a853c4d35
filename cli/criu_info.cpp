#include "criu_info.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/text.h"
#include "cli.h"
#include "subprocess.h"

namespace cuda_criu::cli {
namespace {

std::string env_or_empty(const char *name)
{
	const char *v = getenv(name);
	return v ? v : "";
}

std::string without_trailing_slashes(std::string dir)
{
	while (dir.size() > 1 && dir.back() == '/')
		dir.pop_back();
	return dir;
}

bool is_regular_file(const std::string &path)
{
	struct stat st = {};
	return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

} // namespace

std::vector<std::string> companion_places(Companion what, const std::string &exe,
					  const std::string &installed_plugin_dir)
{
	namespace fs = std::filesystem;
	const fs::path prefix = fs::path(exe).parent_path().parent_path();
	// The Debian package's CRIU first: it lies apart (PREFIX/lib/cuda-criu) so that it never clashes with
	// a distribution's, whose PREFIX/sbin/criu may be too old for the plugin.
	if (what == Companion::Criu)
		return {(prefix / "lib/cuda-criu/sbin/criu").string(), (prefix / "sbin/criu").string()};
	std::vector<std::string> dirs = {(prefix / "plugin").string()};
	if (!installed_plugin_dir.empty()) {
		fs::path dir(installed_plugin_dir);
		if (dir.is_relative())
			dir = prefix / dir;
		dirs.push_back(without_trailing_slashes(dir.lexically_normal().string()));
	}
	return dirs;
}

std::string find_companion(Companion what, const std::string &exe, const std::string &installed_plugin_dir)
{
	for (const std::string &p : companion_places(what, exe, installed_plugin_dir))
		if (what == Companion::Criu ? is_executable_file(p) : is_regular_file(p + "/" + kPluginFileName))
			return p;
	return "";
}

// CUDA_CRIU_INSTALLED_PLUGIN_DIR: the build's CRIU_PLUGIN_DIR (cli/CMakeLists.txt).
std::string find_companion(Companion what)
{
	auto exe = self_executable();
	return exe ? find_companion(what, *exe, CUDA_CRIU_INSTALLED_PLUGIN_DIR) : "";
}

std::string default_libdir()
{
	std::string own = find_companion(Companion::PluginDir);
	return own.empty() ? kCriuDefaultLibdir : own;
}

Result<CriuLocation> find_criu(const std::string &explicit_path)
{
	if (!explicit_path.empty()) {
		if (!is_executable_file(explicit_path))
			return make_error(ENOENT, "--criu %s: not an executable file", explicit_path.c_str());
		return CriuLocation{explicit_path, "--criu", false};
	}
	if (std::string own = find_companion(Companion::Criu); !own.empty())
		return CriuLocation{own, "beside cuda-criu", false};
	for (const char *p : {"/usr/local/sbin/criu", "/usr/sbin/criu", "/usr/bin/criu"})
		if (is_executable_file(p))
			return CriuLocation{p, p, false};
	if (std::string found = search_path("criu", env_or_empty("PATH")); !found.empty())
		return CriuLocation{found, "$PATH", true};
	return make_error(ENOENT,
			  "no criu beside cuda-criu (../lib/cuda-criu/sbin/criu, ../sbin/criu), in /usr/local/sbin, "
			  "/usr/sbin, /usr/bin or $PATH");
}

Result<CriuVersion> criu_version(const std::string &path, const std::vector<std::string> &env)
{
	int status = 0;
	auto out = run_capture({path, "--version"}, kGraceMs, status, 64 * 1024, env);
	if (!out)
		return std::move(out).error();
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return make_error(EIO, "%s --version %s: %s", path.c_str(), describe_wait_status(status).c_str(),
				  trim(*out).c_str());
	size_t at = out->find("Version:");
	CriuVersion v;
	if (at == std::string::npos ||
	    std::sscanf(out->c_str() + at, "Version: %d.%d.%d", &v.major, &v.minor, &v.patch) < 2)
		return make_error(EPROTO, "%s --version printed no 'Version: X.Y' line: %s", path.c_str(),
				  trim(*out).c_str());
	v.text = v.patch ? format("%d.%d.%d", v.major, v.minor, v.patch) : format("%d.%d", v.major, v.minor);
	return v;
}

std::string config_libdir(const std::string &config_file)
{
	std::ifstream f(config_file);
	std::string line, dir;
	while (std::getline(f, line)) {
		line = trim(line.substr(0, line.find('#')));
		if (line.rfind("--", 0) == 0)
			line = line.substr(2);
		size_t sep = line.find_first_of(" \t=");
		if (sep == std::string::npos || line.substr(0, sep) != "libdir")
			continue;
		std::string value = trim(line.substr(sep + 1));
		if (!value.empty() && value[0] == '=')
			value = trim(value.substr(1));
		if (value.size() >= 2 && value.front() == '"' && value.back() == '"')
			value = value.substr(1, value.size() - 2);
		dir = value; // like CRIU, the last one wins
	}
	return dir;
}

CriuEnv caller_criu_env()
{
	return {env_or_empty("HOME"), env_or_empty("CRIU_CONFIG_FILE"), env_or_empty("CRIU_LIBS_DIR"),
		env_or_empty("PATH")};
}

std::string criu_config_dir()
{
	std::string dir = env_or_empty("CUDA_CRIU_CRIU_CONFIG_DIR");
	return dir.empty() ? "/etc/criu" : dir;
}

Libdir criu_libdir(const CriuEnv &env, const std::string &runtime_conf)
{
	std::vector<std::pair<std::string, std::string>> files = {{criu_config_dir() + "/default.conf", ""}};
	if (!env.home.empty())
		files.push_back({env.home + "/.criu/default.conf", ""});
	if (!env.config_file.empty())
		files.push_back({env.config_file, "$CRIU_CONFIG_FILE "});
	if (!runtime_conf.empty())
		files.push_back({runtime_conf, ""});
	Libdir found;
	for (const auto &[file, label] : files)
		if (std::string dir = config_libdir(file); !dir.empty())
			found = {dir, format("libdir in %s%s", label.c_str(), file.c_str())};
	if (found.dir.empty())
		found = env.libs_dir.empty() ? Libdir{kCriuDefaultLibdir, "CRIU's default, no libdir set", true}
					     : Libdir{env.libs_dir, "$CRIU_LIBS_DIR"};
	found.dir = without_trailing_slashes(found.dir);
	return found;
}

} // namespace cuda_criu::cli
