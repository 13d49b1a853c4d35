// The one log sink. Inside CRIU it forwards to CRIU's print_on_level (installed by the ABI layer);
// elsewhere (CLI, tests) it writes to stderr. Lines start "cuda_plugin: ", or "Error (cuda_plugin): " and
// "Warn  (cuda_plugin): " for errors and warnings.
#pragma once

namespace cuda_criu {

enum class LogLevel { Error = 1, Warn = 2, Info = 3, Debug = 4 }; // CRIU's loglevel numbers

// level: CRIU's numeric level; line: a complete message ending in '\n' (owned by the caller).
using LogSink = void (*)(LogLevel level, const char *line);

// Any thread may write to the new sink.
void set_log_sink(LogSink sink);
// From now on the sink is called only from the calling thread (CRIU's log is not thread-safe): lines of
// other threads (driver warm-up, workers) are queued and written before that thread's next line, or by
// log_flush_queued(). A no-op for lines of other threads.
void log_only_from_this_thread();
void log_flush_queued();
void log_write(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_ERROR(...) ::cuda_criu::log_write(::cuda_criu::LogLevel::Error, __VA_ARGS__)
#define LOG_WARN(...) ::cuda_criu::log_write(::cuda_criu::LogLevel::Warn, __VA_ARGS__)
#define LOG_INFO(...) ::cuda_criu::log_write(::cuda_criu::LogLevel::Info, __VA_ARGS__)
#define LOG_DEBUG(...) ::cuda_criu::log_write(::cuda_criu::LogLevel::Debug, __VA_ARGS__)

} // namespace cuda_criu
