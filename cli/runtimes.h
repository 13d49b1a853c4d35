// Whether each container runtime on this machine (runc, crun, podman, containerd) makes CRIU load our
// plugin: where the CRIU it runs looks for plugins, what it finds there, and which criu it runs.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"
#include "criu_info.h"

namespace cuda_criu::cli {

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

// The containerd that target names, its configuration file or the socket it serves (--containerd):
// through the socket, the process listening on it and the configuration it was started with; through a
// configuration file, the containerd running with it, else the one installed. Reported as check_runtimes
// reports containerd, and for containerd 2.x whether its CRI is enabled (it then checkpoints for the kubelet
// and restores from checkpoint images).
Result<RuntimeReport> check_containerd_at(const std::string &target, const std::string &criu_option);

} // namespace cuda_criu::cli
