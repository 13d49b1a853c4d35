#include "base/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <string>

#include "base/format.h"

namespace cuda_criu {
namespace {

void stderr_sink(LogLevel, const char *line) { std::fputs(line, stderr); }

std::atomic<LogSink> g_sink{stderr_sink};

} // namespace

void set_log_sink(LogSink sink) { g_sink.store(sink ? sink : stderr_sink); }

void log_write(LogLevel level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	// Errors and warnings look like CRIU's own ("Error (file:line): ..."), so that the usual grep for
	// "Error" in a CRIU log finds ours too.
	const char *prefix = level == LogLevel::Error ? "Error (cuda_plugin): "
			     : level == LogLevel::Warn ? "Warn  (cuda_plugin): "
						       : "cuda_plugin: ";
	std::string line = prefix + vformat(fmt, ap);
	va_end(ap);
	if (line.empty() || line.back() != '\n')
		line += '\n';
	g_sink.load()(level, line.c_str());
}

} // namespace cuda_criu
