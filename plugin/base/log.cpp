#include "base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/format.h"

namespace cuda_criu {
namespace {

void stderr_sink(LogLevel, const char *line) { std::fputs(line, stderr); }

std::atomic<LogSink> g_sink{stderr_sink};
std::atomic<pid_t> g_owner{0}; // 0: any thread may write
std::mutex g_queue_mu;
std::vector<std::pair<LogLevel, std::string>> g_queue;

bool may_write() { return g_owner.load() == 0 || g_owner.load() == gettid(); }

} // namespace

void set_log_sink(LogSink sink)
{
	g_sink.store(sink ? sink : stderr_sink);
	g_owner.store(0);
}

void log_only_from_this_thread() { g_owner.store(gettid()); }

void log_flush_queued()
{
	if (!may_write())
		return;
	std::vector<std::pair<LogLevel, std::string>> lines;
	{
		std::lock_guard<std::mutex> g(g_queue_mu);
		lines.swap(g_queue);
	}
	for (const auto &[level, line] : lines)
		g_sink.load()(level, line.c_str());
}

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
	if (!may_write()) {
		std::lock_guard<std::mutex> g(g_queue_mu);
		g_queue.emplace_back(level, std::move(line));
		return;
	}
	log_flush_queued();
	g_sink.load()(level, line.c_str());
}

} // namespace cuda_criu
