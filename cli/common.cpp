// What the commands share: usage errors, the driver, this program's path, the log sink.
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>

#include "base/log.h"
#include "cli.h"
#include "core/options.h"
#include "driver/libcuda.h"

namespace cuda_criu::cli {
namespace {

std::atomic<bool> g_verbose{false};

// Errors and warnings always reach stderr; the driver layer's progress messages only with -v, so that
// output meant for scripts (cuda-checkpoint --get-state above all) stays clean.
void cli_log_sink(LogLevel level, const char *line)
{
	if (level <= LogLevel::Warn || g_verbose.load())
		std::fputs(line, stderr);
}

} // namespace

void set_verbose(bool verbose)
{
	g_verbose = verbose;
	set_log_sink(cli_log_sink);
}

int usage_error(const std::string &command, const std::string &message)
{
	std::fprintf(stderr, "cuda-criu%s%s: %s\nTry 'cuda-criu help%s%s'.\n", command.empty() ? "" : " ",
		     command.c_str(), message.c_str(), command.empty() ? "" : " ", command.c_str());
	return kExitUsage;
}

int report_failure(const std::string &message)
{
	std::fprintf(stderr, "cuda-criu: %s\n", message.c_str());
	return kExitFailure;
}

Result<Driver *> open_driver(const std::string &libcuda_override)
{
	std::string path = libcuda_override;
	if (path.empty()) {
		auto options = load_options_from_environment();
		if (!options)
			return std::move(options).error().context("the plugin's options");
		path = options->libcuda;
	}
	return load_libcuda(path);
}

Result<std::string> self_executable()
{
	char buf[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
	if (n < 0)
		return errno_error("readlink /proc/self/exe");
	return std::string(buf, static_cast<size_t>(n));
}

} // namespace cuda_criu::cli
