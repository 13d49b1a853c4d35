// The runtime lines of cuda-criu check. Each runtime starts CRIU in its own way; what decides whether our
// plugin is loaded is the plugin directory (CRIU's configuration files and environment as that runtime
// passes them), what lies in it, and the criu the runtime runs.
#include "runtimes.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/format.h"
#include "os/dir.h"
#include "cli.h"
#include "criu_info.h"
#include "elf_file.h"
#include "criu_check.h"
#include "subprocess.h"

namespace cuda_criu::cli {
namespace {

// Where packages install runtimes; also the directories whose criu check trusts enough to run.
const char *const kSystemDirs[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"};
// systemd's PATH, which a containerd started by it has.
constexpr const char *kServicePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
constexpr const char *kContainerdConfig = "/etc/containerd/config.toml";
// `podman info` starts podman's whole storage layer; it may take a while on a busy machine.
constexpr unsigned kPodmanInfoMs = 20000;

std::string find_system_binary(const std::string &name)
{
	for (const char *d : kSystemDirs)
		if (is_executable_file(std::string(d) + "/" + name))
			return std::string(d) + "/" + name;
	return "";
}

std::string real_path(const std::string &path)
{
	char buf[PATH_MAX];
	return realpath(path.c_str(), buf) ? buf : path;
}

std::string first_line(const std::string &text)
{
	std::string line = text.substr(0, text.find('\n'));
	while (!line.empty() && (line.back() == '\r' || line.back() == ' '))
		line.pop_back();
	return line;
}

// `binary --version`, all of its output; "" when it cannot be run.
std::string version_output(const std::string &binary)
{
	int status = 0;
	auto out = run_capture({binary, "--version"}, kGraceMs, status);
	return out && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? *out : "";
}

// The word after "version" in "runc version 1.1.5+ds1" or "crun version 1.8.1"; for containerd
// ("containerd github.com/containerd/containerd v2.0.4 <commit>") the third word without its 'v'.
std::string version_word(const std::string &line, bool third_word = false)
{
	std::stringstream words(line);
	std::string w, prev;
	int i = 0;
	while (words >> w) {
		if (third_word ? ++i == 3 : prev == "version")
			return !w.empty() && w[0] == 'v' ? w.substr(1) : w;
		prev = w;
	}
	return "";
}

// CRIU's environment as the process pid has it (containerd's); false if it cannot be read.
bool process_env(pid_t pid, CriuEnv &env)
{
	std::ifstream f(format("/proc/%d/environ", pid), std::ios::binary);
	if (!f)
		return false;
	std::string var;
	bool has_path = false;
	while (std::getline(f, var, '\0')) {
		auto value = [&](const char *name) { return var.substr(std::string(name).size() + 1); };
		if (var.rfind("HOME=", 0) == 0)
			env.home = value("HOME");
		else if (var.rfind("CRIU_CONFIG_FILE=", 0) == 0)
			env.config_file = value("CRIU_CONFIG_FILE");
		else if (var.rfind("CRIU_LIBS_DIR=", 0) == 0)
			env.libs_dir = value("CRIU_LIBS_DIR");
		else if (var.rfind("PATH=", 0) == 0) {
			env.path = value("PATH");
			has_path = true;
		}
	}
	if (!has_path)
		env.path = kServicePath;
	return true;
}

// The pid of a running process whose executable is binary; 0 if none.
pid_t find_process(const std::string &binary)
{
	const std::string want = real_path(binary);
	for (pid_t pid : proc_pids()) {
		char buf[PATH_MAX];
		ssize_t n = readlink(format("/proc/%d/exe", pid).c_str(), buf, sizeof(buf) - 1);
		if (n > 0 && std::string(buf, static_cast<size_t>(n)) == want)
			return pid;
	}
	return 0;
}

struct Verdict {
	bool loads = false;
	std::string detail, fix;
};

// What CRIU finds in libdir (criu_check.h: check_plugin); conf_to_edit: the file that would set another.
Verdict plugin_in(const Libdir &libdir, const std::string &conf_to_edit)
{
	CheckLine l = check_plugin(libdir, "add 'libdir DIR_OF_cuda_plugin.so' to " + conf_to_edit);
	if (l.level != Level::Ok)
		return {false, l.detail, l.hint};
	return {true, format("loads %s/%s (%s)", libdir.dir.c_str(), kPluginFileName, libdir.source.c_str()), ""};
}

// The criu found in path, checked as check checks its own (criu_check.h), but run only where check
// trusts it: in a system directory, or the one --criu names.
Verdict criu_in(const std::string &path, const std::string &criu_option)
{
	std::string criu = search_path("criu", path);
	if (criu.empty())
		return {false, "no criu in PATH (" + path + ")",
			"install CRIU 4.0 or newer into /usr/local/sbin or /usr/sbin"};
	bool trusted = !criu_option.empty() && real_path(criu) == real_path(criu_option);
	for (const char *d : kSystemDirs)
		trusted |= criu.rfind(std::string(d) + "/", 0) == 0;
	Checks c;
	CriuFacts facts = check_criu(c, CriuLocation{criu, "$PATH", !trusted});
	for (const CheckLine &l : c.lines())
		if (l.name != "criu-patch" && l.level != Level::Ok)
			return {false, l.detail, l.hint};
	return {true, format("CRIU %s (%s)", facts.version->text.c_str(), criu.c_str()), ""};
}

// criu first (a runtime without a usable criu cannot checkpoint at all), then the plugin directory.
Verdict combine(const Verdict &criu, const Verdict &plugin)
{
	if (!criu.loads)
		return {false, criu.detail + "; as for the plugin, CRIU " + (plugin.loads ? plugin.detail : "finds " + plugin.detail),
			criu.fix + (plugin.loads ? "" : "; " + plugin.fix)};
	if (!plugin.loads)
		return {false, criu.detail + " will not load cuda_plugin.so: " + plugin.detail, plugin.fix};
	return {true, criu.detail + " " + plugin.detail, ""};
}

RuntimeReport report(const std::string &name, const std::string &binary)
{
	RuntimeReport r;
	r.name = name;
	r.binary = binary;
	return r;
}

void fill(RuntimeReport &r, const Verdict &v, const Libdir &libdir, const std::string &prefix)
{
	r.loads = v.loads;
	r.plugin_dir = libdir.dir;
	r.libdir_source = libdir.source;
	r.detail = prefix + v.detail;
	r.fix = v.fix;
}

// runc reads CONFIG_DIR/runc.conf (a container's org.criu.config annotation may name another file) and
// starts criu from its PATH with its own environment. how: "" for a direct call, else who called it.
RuntimeReport check_runc(const std::string &binary, const CriuEnv &env, const std::string &how,
			 const std::string &criu_option)
{
	RuntimeReport r = report("runc", binary);
	r.version = version_word(first_line(version_output(binary)));
	const std::string conf = criu_config_dir() + "/runc.conf";
	Libdir libdir = criu_libdir(env, conf);
	Verdict v = combine(criu_in(env.path, criu_option), plugin_in(libdir, conf));
	fill(r, v, libdir,
	     format("runc %s (%s%s): ", r.version.empty() ? "?" : r.version.c_str(), binary.c_str(), how.c_str()));
	return r;
}

// crun checkpoints through libcriu (criu from its PATH, its environment) only when built with it; it
// reads CONFIG_DIR/crun.conf (else runc.conf) only when the binary knows that file.
RuntimeReport check_crun(const std::string &binary, const CriuEnv &env, const std::string &how,
			 const std::string &criu_option)
{
	RuntimeReport r = report("crun", binary);
	std::string out = version_output(binary);
	r.version = version_word(first_line(out));
	const std::string prefix =
		format("crun %s (%s%s): ", r.version.empty() ? "?" : r.version.c_str(), binary.c_str(), how.c_str());
	if (out.find("+CRIU") == std::string::npos) {
		r.detail = prefix + "built without CRIU (no +CRIU in 'crun --version'): it cannot checkpoint";
		r.fix = "install a crun built with CRIU support, or use runc";
		return r;
	}
	if (void *h = dlopen("libcriu.so.2", RTLD_NOW | RTLD_LOCAL)) {
		dlclose(h);
	} else {
		const char *why = dlerror();
		r.detail = prefix + "cannot load libcriu.so.2: " + (why ? why : "unknown error");
		r.fix = "install CRIU's library libcriu.so.2 (package libcriu2 or criu-libs)";
		return r;
	}
	auto knows_conf = file_contains(binary, "/etc/criu/crun.conf");
	const bool reads_conf = knows_conf && *knows_conf;
	// Such a crun falls back to runc.conf when crun.conf does not exist.
	std::string conf;
	if (reads_conf) {
		struct stat st;
		conf = criu_config_dir() + (stat((criu_config_dir() + "/crun.conf").c_str(), &st) == 0 ? "/crun.conf"
												    : "/runc.conf");
	}
	Libdir libdir = criu_libdir(env, conf);
	Verdict v = combine(criu_in(env.path, criu_option),
			    plugin_in(libdir, reads_conf ? conf : criu_config_dir() + "/default.conf"));
	fill(r, v, libdir, prefix + (reads_conf ? "" : "reads no crun.conf; "));
	return r;
}

// podman needs criu in its PATH, and so does the OCI runtime it runs with that PATH; CRIU's other
// variables ($HOME, $CRIU_CONFIG_FILE, $CRIU_LIBS_DIR) of podman's caller never reach CRIU.
RuntimeReport check_podman(const std::string &binary, const std::string &criu_option)
{
	RuntimeReport r = report("podman", binary);
	r.version = version_word(first_line(version_output(binary)));
	const std::string prefix = format("podman %s (%s)", r.version.empty() ? "?" : r.version.c_str(), binary.c_str());
	int status = 0;
	auto out = run_capture({binary, "info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Path}}"},
			       kPodmanInfoMs, status);
	std::stringstream words(out ? first_line(*out) : "");
	std::string name, path;
	words >> name >> path;
	if (!out || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || path.empty() || path[0] != '/') {
		r.detail = prefix + ": cannot tell its OCI runtime: " + (out ? first_line(*out) : out.error().message());
		r.fix = "run 'podman info' to see what fails";
		return r;
	}
	CriuEnv none;
	none.path = caller_criu_env().path;
	const std::string how = ", run by podman";
	RuntimeReport inner;
	if (name == "runc") {
		inner = check_runc(path, none, how, criu_option);
	} else if (name == "crun") {
		inner = check_crun(path, none, how, criu_option);
		if (inner.fix.find("or use runc") != std::string::npos)
			inner.fix += " (podman --runtime runc, or runtime = \"runc\" in containers.conf)";
	}
	else {
		r.detail = prefix + ": its OCI runtime " + name + " (" + path + ") is neither runc nor crun";
		r.fix = "use runc or crun with podman (--runtime, or runtime in containers.conf)";
		return r;
	}
	inner.name = r.name;
	inner.binary = r.binary;
	inner.version = r.version;
	inner.detail = prefix + ": " + inner.detail;
	return inner;
}

// The inode of the listening unix socket bound to path (/proc/net/unix), 0 if none.
unsigned long listening_socket_inode(const std::string &path)
{
	std::ifstream f("/proc/net/unix");
	std::string line;
	std::getline(f, line); // the header
	while (std::getline(f, line)) {
		std::stringstream w(line);
		std::string num, refs, proto, flags, type, st, name;
		unsigned long inode = 0;
		w >> num >> refs >> proto >> flags >> type >> st >> inode >> name;
		if (name == path && flags == "00010000") // __SO_ACCEPTCON: it listens
			return inode;
	}
	return 0;
}

// The pid of the process holding the socket of that inode; 0 if none.
pid_t socket_owner(unsigned long inode)
{
	const std::string want = format("socket:[%lu]", inode);
	for (pid_t pid : proc_pids()) {
		const std::string dir = format("/proc/%d/fd", pid);
		for (const std::string &fd : dir_entries(dir)) {
			char buf[64];
			ssize_t n = readlink(format("%s/%s", dir.c_str(), fd.c_str()).c_str(), buf, sizeof(buf) - 1);
			if (n > 0 && std::string(buf, static_cast<size_t>(n)) == want)
				return pid;
		}
	}
	return 0;
}

// The configuration file of the containerd process pid: its --config (-c), else containerd's default.
std::string containerd_config_of(pid_t pid)
{
	std::ifstream f(format("/proc/%d/cmdline", pid), std::ios::binary);
	std::string arg, prev, config = kContainerdConfig;
	while (std::getline(f, arg, '\0')) {
		if (prev == "--config" || prev == "-c")
			config = arg;
		else if (arg.rfind("--config=", 0) == 0)
			config = arg.substr(9);
		prev = arg;
	}
	return config;
}

// Whether the containerd configuration file disables the CRI (its grpc service, or in version 3 its
// runtime part) in disabled_plugins.
bool containerd_cri_disabled(const std::string &config)
{
	std::ifstream f(config);
	std::string line, list;
	bool in_list = false;
	while (std::getline(f, line)) {
		size_t b = line.find_first_not_of(" \t");
		if (b == std::string::npos || line[b] == '#')
			continue;
		if (line[b] == '[')
			break; // past the top-level keys
		if (line.compare(b, 16, "disabled_plugins") == 0)
			in_list = true;
		if (in_list)
			list += line;
		if (in_list && line.find(']') != std::string::npos)
			in_list = false;
	}
	for (const char *cri : {"\"cri\"", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"})
		if (list.find(cri) != std::string::npos)
			return true;
	return false;
}

// containerd runs runc (BinaryName, else runc from its PATH) with containerd's own environment. pid: the
// running containerd (0: none found), whose environment CRIU gets.
RuntimeReport check_containerd(const std::string &binary, const std::string &config, pid_t pid,
			       const std::string &criu_option)
{
	RuntimeReport r = report("containerd", binary);
	r.version = version_word(first_line(version_output(binary)), true);
	int major = 0, minor = 0;
	std::sscanf(r.version.c_str(), "%d.%d", &major, &minor);
	const bool cri_off = major >= 2 && containerd_cri_disabled(config);
	const std::string prefix =
		format("containerd %s (%s, %s; %s): ", r.version.empty() ? "?" : r.version.c_str(), binary.c_str(),
		       config.c_str(),
		       major < 2 ? "only ctr and nerdctl checkpoint, the kubelet's API needs containerd 2.0"
		       : cri_off ? "its CRI is disabled: no checkpoint or restore for the kubelet"
				 : "its CRI checkpoints for the kubelet and restores from checkpoint images");
	CriuEnv env;
	env.path = kServicePath;
	std::string env_note = format(", containerd's environment (pid %d)", pid);
	if (!pid || !process_env(pid, env))
		env_note = ", containerd not running: its environment taken as systemd's";
	std::string runc = containerd_runc_binary(config);
	if (runc.empty())
		runc = search_path("runc", env.path);
	if (runc.empty() || !is_executable_file(runc)) {
		r.detail = prefix + "no runc to run (" + (runc.empty() ? "none in its PATH" : runc + " is not executable") + ")";
		r.fix = "install runc, or set BinaryName in the runc runtime's options in " + config;
		return r;
	}
	RuntimeReport inner = check_runc(runc, env, ", run by containerd" + env_note, criu_option);
	inner.name = r.name;
	inner.binary = r.binary;
	inner.version = r.version;
	inner.detail = prefix + inner.detail;
	if (cri_off) {
		inner.loads = false;
		inner.fix = "take the CRI (io.containerd.grpc.v1.cri, io.containerd.cri.v1.runtime) out of "
			    "disabled_plugins in " + config + (inner.fix.empty() ? "" : "; " + inner.fix);
	}
	return inner;
}

} // namespace

std::string containerd_runc_binary(const std::string &config)
{
	std::ifstream f(config);
	std::string line, section, binary;
	while (std::getline(f, line)) {
		size_t b = line.find_first_not_of(" \t");
		if (b == std::string::npos || line[b] == '#')
			continue;
		line = line.substr(b);
		if (line[0] == '[') {
			section = line;
			continue;
		}
		if (section.find("runtimes.runc.options]") == std::string::npos || line.rfind("BinaryName", 0) != 0)
			continue;
		size_t q1 = line.find_first_of("\"'"), q2 = q1 == std::string::npos ? q1 : line.find(line[q1], q1 + 1);
		if (q2 != std::string::npos)
			binary = line.substr(q1 + 1, q2 - q1 - 1);
	}
	return binary;
}

Result<RuntimeReport> check_containerd_at(const std::string &target, const std::string &criu_option)
{
	struct stat st;
	if (stat(target.c_str(), &st) != 0)
		return errno_error("--containerd %s", target.c_str());
	pid_t pid = 0;
	std::string config = target;
	if (S_ISSOCK(st.st_mode)) {
		unsigned long inode = listening_socket_inode(real_path(target));
		pid = inode ? socket_owner(inode) : 0;
		if (!pid)
			return make_error(ENOENT, "--containerd %s: no process listens on that socket", target.c_str());
		config = containerd_config_of(pid);
	} else {
		// The running containerd started with that configuration file, if any.
		for (pid_t p : proc_pids())
			if (real_path(format("/proc/%d/exe", p)).ends_with("/containerd") &&
			    real_path(containerd_config_of(p)) == real_path(target))
				pid = p;
	}
	std::string binary = pid ? real_path(format("/proc/%d/exe", pid)) : find_system_binary("containerd");
	if (binary.empty())
		return make_error(ENOENT, "--containerd %s: no containerd running with it, and none installed",
				  target.c_str());
	return check_containerd(binary, config, pid, criu_option);
}

std::vector<RuntimeReport> check_runtimes(const std::vector<std::string> &only, const std::string &criu_option)
{
	std::vector<RuntimeReport> reports;
	for (const char *name : {"runc", "crun", "podman", "containerd"}) {
		bool wanted = only.empty();
		for (const std::string &o : only)
			wanted |= o == name;
		std::string binary = wanted ? find_system_binary(name) : "";
		if (binary.empty())
			continue;
		const std::string n = name;
		if (n == "runc")
			reports.push_back(check_runc(binary, caller_criu_env(), "", criu_option));
		else if (n == "crun")
			reports.push_back(check_crun(binary, caller_criu_env(), "", criu_option));
		else if (n == "podman")
			reports.push_back(check_podman(binary, criu_option));
		else
			reports.push_back(check_containerd(binary, kContainerdConfig, find_process(binary), criu_option));
	}
	return reports;
}

} // namespace cuda_criu::cli
