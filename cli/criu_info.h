// Finding CRIU and our plugin the way CRIU and the container runtimes do: the CRIU binary and its
// version, CRIU's configuration files and environment, the plugin directory they give it.
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

// explicit_path (from --criu) must name an executable file. Otherwise the criu that came with this
// cuda-criu (find_companion), then the fixed places /usr/local/sbin/criu, /usr/sbin/criu and /usr/bin/criu
// are tried in that order, then $PATH.
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

// What came with this cuda-criu, found from its own executable, PREFIX/bin/cuda-criu, as each layout that
// ships it puts them: the Debian package (PREFIX/lib/cuda-criu/sbin/criu, the plugin in CRIU_PLUGIN_DIR),
// the GPU bundle (scripts/gpu-bundle.sh: PREFIX/sbin/criu, PREFIX/plugin/), the build tree
// (PREFIX/plugin/) and `cmake --install` (PREFIX/sbin/criu when CRIU was installed to the same prefix,
// the plugin in CRIU_PLUGIN_DIR). A program beside our own executable is trusted as that executable is:
// one installation put both there.
enum class Companion { Criu, PluginDir };

// The places of what for the executable exe, in the order they are tried; installed_plugin_dir: the
// build's CRIU_PLUGIN_DIR (relative to the install prefix, as install() takes it, or absolute; "" for
// none). Looks at no file.
std::vector<std::string> companion_places(Companion what, const std::string &exe,
					  const std::string &installed_plugin_dir);

// The first of those places that holds it (an executable criu; a directory with a cuda_plugin.so file), or
// "" when none does.
std::string find_companion(Companion what, const std::string &exe, const std::string &installed_plugin_dir);
// The same for this program's executable and the CRIU_PLUGIN_DIR it was built with.
std::string find_companion(Companion what);

// The plugin directory given to CRIU with -L when --libdir is not: the one that came with this cuda-criu
// (find_companion), else CRIU's default.
std::string default_libdir();

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
	bool crius_default = false; // nothing set it
};
Libdir criu_libdir(const CriuEnv &env, const std::string &runtime_conf);

// The `libdir` a CRIU configuration file sets ("libdir /x", "libdir=/x" or "--libdir /x"), or "" when it
// sets none or cannot be read.
std::string config_libdir(const std::string &config_file);

} // namespace cuda_criu::cli
