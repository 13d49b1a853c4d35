// The command line of cuda-criu roundtrip, parsed against its entry in the command table, into
// RoundtripOptions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "roundtrip/probes.h"

namespace cuda_criu::cli::roundtrip {

struct RoundtripOptions {
	std::vector<std::string> command;
	std::string cwd; // the program's working directory; empty: this one's
	std::string name;
	std::string criu;
	std::string libdir;
	std::string dir;
	bool keep_images = false;
	ReadySpec ready;
	std::string health_cmd;
	unsigned long repeat = 1;
	bool leave_running = false;
	bool require_cuda = false;
	std::optional<std::string> device_map;
	unsigned start_ms = 120 * 1000;
	unsigned dump_ms = 600 * 1000;
	unsigned restore_ms = 600 * 1000;
	unsigned health_ms = 60 * 1000;
	unsigned settle_ms = 1000;
	std::vector<std::string> criu_env;
	std::vector<std::string> criu_args;
	std::string json_path;
	std::string junit_path;
};

// The options (a's positionals: the program), or the exit status when the command must end now (bad
// usage).
std::optional<int> parse_roundtrip_options(const ParsedArgs &a, RoundtripOptions &out);

} // namespace cuda_criu::cli::roundtrip
