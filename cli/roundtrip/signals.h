// The round trip's waiting: the signals that stop it, sleeps that a signal ends early, and deadlines.
#pragma once

#include <array>
#include <chrono>
#include <csignal>
#include <string>

namespace cuda_criu::cli::roundtrip {

using Clock = std::chrono::steady_clock;

// SIGINT, SIGTERM and SIGHUP only set a flag: every wait polls it, stops, and the cleanup runs. A signal
// ignored on entry (SIGINT of a background job) stays ignored. SIGPIPE does nothing: a reader of the
// table that goes away (`| head`) must not end this program before its cleanup.
class SignalHandlers {
public:
	SignalHandlers();
	SignalHandlers(const SignalHandlers &) = delete;
	SignalHandlers &operator=(const SignalHandlers &) = delete;
	~SignalHandlers() { restore(); }
	void restore();

private:
	static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
	std::array<struct sigaction, 3> old_{};
	struct sigaction old_pipe_ = {};
	bool restored_ = false;
};

// The signal caught, 0 for none.
int caught_signal();
inline bool interrupted() { return caught_signal() != 0; }
// "SIGTERM", or "signal 64".
std::string signal_name(int signo);

// Sleeps up to ms; a signal ends the sleep early.
void pause_ms(long ms);
double seconds_since(Clock::time_point t);
long ms_left(Clock::time_point deadline);
inline Clock::time_point deadline_in(unsigned ms) { return Clock::now() + std::chrono::milliseconds(ms); }

// How often a wait looks again.
inline constexpr long kPollMs = 20;

} // namespace cuda_criu::cli::roundtrip
