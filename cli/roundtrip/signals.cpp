#include "roundtrip/signals.h"

#include <cstring>
#include <ctime>

#include "base/format.h"

namespace cuda_criu::cli::roundtrip {
namespace {

volatile std::sig_atomic_t g_signal = 0;

void on_signal(int signo) { g_signal = signo; }

void on_sigpipe(int /*signo*/) {}

} // namespace

SignalHandlers::SignalHandlers()
{
	struct sigaction sa = {};
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	// No SA_RESTART: a sleep in progress ends early and the loop around it sees the flag.
	for (size_t i = 0; i < kSignals.size(); i++) {
		sigaction(kSignals[i], &sa, &old_[i]);
		if (old_[i].sa_handler == SIG_IGN)
			sigaction(kSignals[i], &old_[i], nullptr);
	}
	// A handler, not SIG_IGN: an ignored signal would stay ignored in the programs started here.
	struct sigaction pipe = {};
	pipe.sa_handler = on_sigpipe;
	sigemptyset(&pipe.sa_mask);
	sigaction(SIGPIPE, &pipe, &old_pipe_);
}

void SignalHandlers::restore()
{
	if (restored_)
		return;
	restored_ = true;
	for (size_t i = 0; i < kSignals.size(); i++)
		sigaction(kSignals[i], &old_[i], nullptr);
	sigaction(SIGPIPE, &old_pipe_, nullptr);
}

int caught_signal() { return g_signal; }

std::string signal_name(int signo)
{
	const char *abbrev = sigabbrev_np(signo);
	return abbrev ? format("SIG%s", abbrev) : format("signal %d", signo);
}

void pause_ms(long ms)
{
	timespec ts{ms / 1000, (ms % 1000) * 1000000};
	nanosleep(&ts, nullptr);
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

long ms_left(Clock::time_point deadline)
{
	return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

} // namespace cuda_criu::cli::roundtrip
