// What the round trip shows of a log after a failure: lines made safe to print, the end of a file, the
// lines of a CRIU log that explain a failure and a hint for them; and the plugin's own lines of a CRIU
// log, told apart from anything else there (a path or a name CRIU prints can hold any text).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cuda_criu::cli::roundtrip {

// Lines of a file that explain a failure, and where they come from.
struct LogBlock {
	std::string file;
	std::vector<std::string> lines;
};

inline constexpr size_t kExplainLines = 20;

// A line of a program's or CRIU's output made safe for a terminal, JSON and XML: valid UTF-8, no control
// characters but tabs, at most 500 bytes.
std::string clean_line(std::string_view s);

// The lines of the last 8 MiB of path, cleaned (the first, possibly cut, line dropped when cut).
std::vector<std::string> read_lines(const std::string &path);

// The last n lines of a program's output (or of any file).
LogBlock tail_of(const std::string &path, size_t n = kExplainLines);

// What a CRIU log says about a failure: its error lines and, in the room left, the last lines of our
// plugin, in the order of the log; its end when neither is there.
LogBlock criu_log_excerpt(const std::string &path);

// A hint for the first known problem the lines show, or "".
std::string hint_for(const std::vector<LogBlock> &logs);

// The message of a line our plugin wrote into a CRIU log ("restore: ..." of "(00.123456) cuda_plugin:
// restore: ..."), nullopt for any other line. Only CRIU's own prefixes (a timestamp, a pid) may come
// before the plugin's prefix.
std::optional<std::string_view> plugin_message(std::string_view line);

// Whether msg (of plugin_message) is one of the plugin's progress lines during a checkpoint or restore
// (plugin/core/progress.h): "checkpoint: 12.3 of 40.0 GiB (1.6 GB/s), 3 of 4 process(es) done".
bool is_progress_message(std::string_view msg);

// Follows a log that a running program (CRIU) writes: each look returns the complete lines added since
// the last one. The log may not exist yet; one that shrank was begun again, and is read from its start.
class LogFollower {
public:
	explicit LogFollower(std::string path) : path_(std::move(path)) {}
	std::vector<std::string> new_lines();

private:
	std::string path_;
	uint64_t offset_ = 0;
	std::string partial_; // the start of a line not yet ended
};

// The count of the plugin's summary line "restore: N CUDA process(es), M failed, ..." in a CRIU log; -1
// unless exactly one such line is there.
int restored_cuda_processes(const std::vector<std::string> &log_lines);

} // namespace cuda_criu::cli::roundtrip
