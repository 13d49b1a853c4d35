#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "base/log.h"

namespace cuda_criu {
namespace {

std::vector<std::string> g_lines; // written only by the owning thread: that is what is tested

void collect(LogLevel, const char *line) { g_lines.push_back(line); }

// CRIU's log is not thread-safe: a line of another thread waits for the owner's next line or flush.
TEST(Log, LinesOfOtherThreadsReachTheSinkOnlyFromTheOwner)
{
	g_lines.clear();
	set_log_sink(collect);
	log_only_from_this_thread();
	std::thread([] { LOG_INFO("from a worker"); }).join();
	EXPECT_TRUE(g_lines.empty());
	LOG_INFO("from the owner");
	ASSERT_EQ(g_lines.size(), 2u);
	EXPECT_EQ(g_lines[0], "cuda_plugin: from a worker\n");
	EXPECT_EQ(g_lines[1], "cuda_plugin: from the owner\n");
	std::thread([] { LOG_WARN("late"); }).join();
	std::thread([] { log_flush_queued(); }).join(); // not the owner: nothing written
	EXPECT_EQ(g_lines.size(), 2u);
	log_flush_queued();
	ASSERT_EQ(g_lines.size(), 3u);
	EXPECT_EQ(g_lines[2], "Warn  (cuda_plugin): late\n");
	set_log_sink(nullptr); // stderr, from any thread, for the other tests
}

} // namespace
} // namespace cuda_criu
