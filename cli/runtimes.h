// Whether each container runtime on this machine (runc, crun, podman, containerd) makes CRIU load our
// plugin: where the CRIU it runs looks for plugins, what it finds there, and which criu it runs.
#pragma once

#include <string>
#include <vector>

namespace cuda_criu::cli {

// The environment CRIU runs with, as far as it decides where plugins come from. A runtime called
// directly passes its caller's; podman passes none; containerd passes its own.
struct CriuEnv {
	std::string home;        // $HOME: $HOME/.criu/default.conf
	std::string config_file; // $CRIU_CONFIG_FILE
	std::string libs_dir;    // $CRIU_LIBS_DIR, used only when no configuration file sets libdir
	std::string path;        // $PATH, where the runtime finds criu
};

// The environment of this process.
CriuEnv caller_criu_env();

// The directory CRIU's configuration files live in: /etc/criu, or $CUDA_CRIU_CRIU_CONFIG_DIR (for tests,
// which must not touch the machine's /etc/criu).
std::string criu_config_dir();

// The plugin directory CRIU 4.2 uses and what set it: configuration files in the order CRIU parses them
// (CONFIG_DIR/default.conf, $HOME/.criu/default.conf, $CRIU_CONFIG_FILE, then runtime_conf; the last
// libdir wins), else $CRIU_LIBS_DIR, else /usr/lib/criu.
struct Libdir {
	std::string dir;
	std::string source; // "libdir in /etc/criu/runc.conf", "$CRIU_LIBS_DIR", "CRIU's default"
};
Libdir criu_libdir(const CriuEnv &env, const std::string &runtime_conf);

// BinaryName in the runc runtime's options of a containerd configuration file ("" if none), in either
// configuration version: [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options] (v2) or
// [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options] (v3).
std::string containerd_runc_binary(const std::string &config);

struct RuntimeReport {
	std::string name;    // runc, crun, podman, containerd
	std::string binary;  // its path
	std::string version; // "1.1.5", "" if unknown
	bool loads = false;  // CRIU run by it loads cuda-criu's plugin
	std::string plugin_dir, libdir_source;
	std::string detail; // one line: what was found
	std::string fix;    // when it does not load (or cannot tell): what to do
};

// Reports on the runtimes among only (empty: all four) found in /usr/local/sbin, /usr/local/bin,
// /usr/sbin, /usr/bin, /sbin or /bin. criu_option: the --criu of check; a criu found through a PATH
// is run (for its version) only when it is that file or lies in one of those directories.
std::vector<RuntimeReport> check_runtimes(const std::vector<std::string> &only, const std::string &criu_option);

} // namespace cuda_criu::cli
