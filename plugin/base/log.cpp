#include "base/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <string>

#include "base/format.h"

namespace cuda_criu {
namespace {

void stderr_sink(LogLevel level, const char *line)
{
	static const char *const names[] = {"", "error: ", "warning: ", "", ""};
	std::fprintf(stderr, "%s%s", names[static_cast<int>(level)], line);
}

std::atomic<LogSink> g_sink{stderr_sink};

} // namespace

void set_log_sink(LogSink sink) { g_sink.store(sink ? sink : stderr_sink); }

void log_write(LogLevel level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	std::string line = "cuda_plugin: " + vformat(fmt, ap);
	va_end(ap);
	if (line.empty() || line.back() != '\n')
		line += '\n';
	g_sink.load()(level, line.c_str());
}

} // namespace cuda_criu
