// How the round trip sees that the program is ready, and healthy again after a restore: a file that
// appears or changes, a line of its output, a TCP port that accepts, or time that passes.
#pragma once

#include <regex.h>
#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>

#include "base/result.h"
#include "roundtrip/signals.h"

namespace cuda_criu::cli::roundtrip {

enum class ReadyKind { None, File, Log, Port, Delay };

struct ReadySpec {
	ReadyKind kind = ReadyKind::None;
	std::string file;
	std::string log_pattern; // a POSIX extended regular expression
	uint16_t port = 0;
	unsigned delay_ms = 0;
};

// Whether 127.0.0.1:port accepts a connection. The connection is closed politely (our side first, then
// a wait of up to a second for the program to close its side), so that no half-closed connection of the
// probe is left in the program when CRIU dumps it.
bool port_accepts(uint16_t port);

// A compiled POSIX extended regular expression.
class Regex {
public:
	static Result<Regex> compile(const std::string &pattern);
	bool matches(const std::string &s) const { return regexec(re_.get(), s.c_str(), 0, nullptr, 0) == 0; }

private:
	struct Free {
		void operator()(regex_t *re) const;
	};
	explicit Regex(std::unique_ptr<regex_t, Free> re) : re_(std::move(re)) {}
	std::unique_ptr<regex_t, Free> re_;
};

// What the readiness criterion compares with: the state of things when a step began.
struct Baseline {
	Clock::time_point when;
	bool file_existed = false;
	timespec mtime{};
	ino_t inode = 0;
	off_t log_offset = 0;
	std::string pending; // a started line of the program's output
};

class ReadyProbe {
public:
	// program_log: the file the program's output goes to (for ReadyKind::Log).
	static Result<ReadyProbe> create(ReadySpec spec, std::string program_log);

	ReadyKind kind() const { return spec_.kind; }
	Baseline baseline() const;
	// Whether the criterion holds now, compared with b; what: how it was seen.
	bool met(Baseline &b, std::string &what) const;
	// Why it did not hold, for a message.
	std::string not_met(const Baseline &b) const;

private:
	ReadyProbe(ReadySpec spec, std::string program_log, std::shared_ptr<const Regex> re)
		: spec_(std::move(spec)), program_log_(std::move(program_log)), re_(std::move(re))
	{
	}
	bool file_changed(const Baseline &b, std::string &what) const;
	bool log_matches(Baseline &b, std::string &what) const;

	ReadySpec spec_;
	std::string program_log_;
	std::shared_ptr<const Regex> re_;
};

} // namespace cuda_criu::cli::roundtrip
