// The checks of CRIU and of our plugin, one verdict line each, written once: `cuda-criu check` prints
// them, the preflight of selftest and roundtrip stops at the first that fails, and each runtime line of
// check is made of them (for the criu that runtime runs and the plugin directory it gives CRIU).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "criu_info.h"

namespace cuda_criu::cli {

enum class Level { Ok, Warn, Fail };

const char *level_name(Level l);

// One check: "ok|warn|fail  NAME  DETAIL", and for a warn or fail how to fix it.
struct CheckLine {
	std::string name;
	Level level = Level::Ok;
	std::string detail;
	std::string hint;
};

class Checks {
public:
	void add(std::string name, Level level, std::string detail, std::string hint = {})
	{
		lines_.push_back({std::move(name), level, std::move(detail), std::move(hint)});
	}
	void add(CheckLine line) { lines_.push_back(std::move(line)); }
	const std::vector<CheckLine> &lines() const { return lines_; }
	Level worst() const;
	// The first line at level or worse, nullptr if none.
	const CheckLine *first(Level level) const;

private:
	std::vector<CheckLine> lines_;
};

// CRIU 4.0 brought the device hooks the plugin needs (PAUSE_DEVICES, CHECKPOINT_DEVICES,
// RESUME_DEVICES_LATE).
inline bool has_device_hooks(const CriuVersion &v) { return v.at_least(4, 0); }

// What check_criu found.
struct CriuFacts {
	std::optional<CriuLocation> location;
	std::optional<CriuVersion> version; // when it ran
	std::optional<bool> patched;        // when its file could be read
};

// The lines "criu" (found; its version, or a warning for one found only through $PATH, which is not
// run), "criu-device-hooks" (4.0 or newer) and "criu-patch" (this project's patch; a warning without).
// env: added to CRIU's environment (LD_LIBRARY_PATH for a CRIU whose libraries are not installed).
CriuFacts check_criu(Checks &c, const Result<CriuLocation> &loc, const std::vector<std::string> &env = {});

// The line "plugin": libdir holds this project's cuda_plugin.so (not CRIU's own of the same file name)
// and no other .so that registers as cuda_plugin (CRIU loads every .so there). how_else: the other fix
// for the hint, after "install cuda_plugin.so into DIR": "give its directory with --libdir".
CheckLine check_plugin(const Libdir &libdir, const std::string &how_else);

// What a preflight found: the CRIU to run and our plugin, or why not (message) and what to do (hint).
struct Preflight {
	bool ok = false;
	std::string message;
	std::string hint;
	std::string criu;
	CriuVersion version;
	std::string plugin; // libdir/cuda_plugin.so
};

// The checks above before a dump, stopping at the first that fails (a criu found only through $PATH
// too: it is not run). criu_option: --criu ("" to look in the usual places); libdir: where CRIU loads
// plugins from (-L); criu_env: added to CRIU's environment.
Preflight preflight_criu_and_plugin(const std::string &criu_option, const std::string &libdir,
				    const std::vector<std::string> &criu_env = {});

} // namespace cuda_criu::cli
