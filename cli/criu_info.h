// Finding CRIU and our plugin the way CRIU and the container runtimes do.
#pragma once

#include <string>
#include <vector>

#include "base/result.h"

namespace cuda_criu::cli {

// Where a CRIU binary was found. A binary seen only through $PATH is reported but never run: a user's
// PATH is not a trusted place to pick a program to run as root from.
struct CriuLocation {
	std::string path;
	std::string how;           // "--criu", "/usr/sbin/criu" (a fixed place), "$PATH"
	bool only_in_path = false; // found only through $PATH: not run
};

// explicit_path (from --criu) must name an executable file. Otherwise the fixed places
// /usr/local/sbin/criu, /usr/sbin/criu and /usr/bin/criu are tried in that order, then $PATH.
Result<CriuLocation> find_criu(const std::string &explicit_path);

struct CriuVersion {
	int major = 0, minor = 0, patch = 0;
	std::string text; // "4.2.1"
	bool at_least(int ma, int mi) const { return major > ma || (major == ma && minor >= mi); }
};

// Runs `path --version` (kGraceMs limit; env added to its environment, for a CRIU that needs
// LD_LIBRARY_PATH) and parses its "Version: X.Y[.Z]" line.
Result<CriuVersion> criu_version(const std::string &path, const std::vector<std::string> &env = {});

// CRIU with criu-patches/ applied exports this flag (a failing RESUME_DEVICES_LATE fails the restore).
inline constexpr const char *kCriuPatchSymbol = "criu_resume_devices_late_errors_fatal";

// The file name CRIU loads our plugin under, and a string only our build of it contains (CRIU's own CUDA
// plugin has the same file name).
inline constexpr const char *kPluginFileName = "cuda_plugin.so";
inline constexpr const char *kPluginMarker = "cuda-plugin.img";
inline constexpr const char *kCriuDefaultLibdir = "/usr/lib/criu";

// The `libdir` a CRIU configuration file sets ("libdir /x", "libdir=/x" or "--libdir /x"), or "" when it
// sets none or cannot be read.
std::string config_libdir(const std::string &config_file);

} // namespace cuda_criu::cli
