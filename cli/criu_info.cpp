#include "criu_info.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "cli.h"
#include "subprocess.h"

namespace cuda_criu::cli {
namespace {

bool is_executable_file(const std::string &path)
{
	struct stat st;
	return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string trim(const std::string &s)
{
	size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
	return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

} // namespace

Result<CriuLocation> find_criu(const std::string &explicit_path)
{
	if (!explicit_path.empty()) {
		if (!is_executable_file(explicit_path))
			return make_error(ENOENT, "--criu %s: not an executable file", explicit_path.c_str());
		return CriuLocation{explicit_path, "--criu", false};
	}
	for (const char *p : {"/usr/local/sbin/criu", "/usr/sbin/criu", "/usr/bin/criu"})
		if (is_executable_file(p))
			return CriuLocation{p, p, false};
	if (const char *path = getenv("PATH")) {
		std::string dirs = path;
		size_t start = 0;
		while (start <= dirs.size()) {
			size_t colon = dirs.find(':', start);
			std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
			start = colon == std::string::npos ? dirs.size() + 1 : colon + 1;
			if (!dir.empty() && dir[0] == '/' && is_executable_file(dir + "/criu"))
				return CriuLocation{dir + "/criu", "$PATH", true};
		}
	}
	return make_error(ENOENT, "no criu in /usr/local/sbin, /usr/sbin, /usr/bin or $PATH");
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

} // namespace cuda_criu::cli
