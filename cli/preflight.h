// The CRIU and plugin checks that come before a dump: which CRIU runs (never one found only through
// $PATH), whether it is new enough for the plugin, and whether a plugin file is this project's. check
// reports each of them; selftest and roundtrip stop at the first that fails.
#pragma once

#include <string>
#include <vector>

#include "criu_info.h"

namespace cuda_criu::cli {

// CRIU 4.0 brought the device hooks the plugin needs (PAUSE_DEVICES, CHECKPOINT_DEVICES,
// RESUME_DEVICES_LATE).
inline bool has_device_hooks(const CriuVersion &v) { return v.at_least(4, 0); }

enum class PluginFile { Missing, Unreadable, Ours, CriusOwn };

// What file (DIR/cuda_plugin.so) is; error: why it could not be read (Missing, Unreadable).
PluginFile classify_plugin(const std::string &file, std::string &error);

// What a preflight found: the CRIU to run and our plugin, or why not (message) and what to do (hint).
struct Preflight {
	bool ok = false;
	std::string message;
	std::string hint;
	std::string criu;
	CriuVersion version;
	std::string plugin; // libdir/cuda_plugin.so
};

// criu_option: --criu ("" to look in the usual places); libdir: where CRIU loads plugins from (-L);
// criu_env: added to CRIU's environment.
Preflight preflight_criu_and_plugin(const std::string &criu_option, const std::string &libdir,
				    const std::vector<std::string> &criu_env = {});

} // namespace cuda_criu::cli
