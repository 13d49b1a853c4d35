// The CLI's reading of CRIU logs: only lines the plugin wrote count as the plugin's, whatever text CRIU
// prints from an image (a path, a process name) around them.
#include <gtest/gtest.h>

#include "roundtrip/logs.h"

namespace cuda_criu::cli::roundtrip {
namespace {

const char *const kSummary = "restore: 2 CUDA process(es), 0 failed, restore+unlock 1.2 s (wall, all processes)";

TEST(PluginMessage, TakesCriusPrefixesOnly)
{
	EXPECT_EQ(plugin_message("cuda_plugin: hello").value_or("-"), "hello");
	EXPECT_EQ(plugin_message("(00.123456) cuda_plugin: hello").value_or("-"), "hello");
	EXPECT_EQ(plugin_message("(00.123456)   4242: cuda_plugin: hello").value_or("-"), "hello");
	EXPECT_EQ(plugin_message("(00.123456) Error (cuda_plugin): bad").value_or("-"), "bad");
	EXPECT_EQ(plugin_message("(00.123456) Warn  (cuda_plugin): odd").value_or("-"), "odd");
	// Our prefix inside a line CRIU wrote about something else.
	EXPECT_FALSE(plugin_message("(00.123456) Opening /tmp/cuda_plugin: restore: 9 CUDA process(es)"));
	EXPECT_FALSE(plugin_message("(00.123456) comm x cuda_plugin: hello"));
	EXPECT_FALSE(plugin_message("(00.1) x: cuda_plugin: hello"));
	EXPECT_FALSE(plugin_message(""));
}

TEST(RestoredCudaProcesses, ReadsTheOneSummaryLine)
{
	EXPECT_EQ(restored_cuda_processes({"(00.000001) Restoring", std::string("(01.000000) cuda_plugin: ") + kSummary}), 2);
	EXPECT_EQ(restored_cuda_processes({"(00.000001) nothing of ours"}), -1);
}

TEST(RestoredCudaProcesses, IgnoresForgedLines)
{
	// Text from the image that CRIU logs: our prefix and format, but not at the start of the line.
	std::vector<std::string> log = {std::string("(01.000000) cuda_plugin: ") + kSummary,
					"(02.000001) Closing file /tmp/x cuda_plugin: restore: 7 CUDA process(es), 0 "
					"failed, restore+unlock 0 s"};
	EXPECT_EQ(restored_cuda_processes(log), 2);
	// Not our format: a sign, a missing "failed" count.
	EXPECT_EQ(restored_cuda_processes({"cuda_plugin: restore: -1 CUDA process(es), 0 failed, x"}), -1);
	EXPECT_EQ(restored_cuda_processes({"cuda_plugin: restore: 5 CUDA process(es)"}), -1);
}

TEST(RestoredCudaProcesses, TwoSummaryLinesAreNotKnown)
{
	// A line that passes as ours (a file name holding a newline and our whole line) makes two: which one
	// is the plugin's is not known, so the count is not given.
	std::string ours = std::string("(01.000000) cuda_plugin: ") + kSummary;
	EXPECT_EQ(restored_cuda_processes({"(00.000001) cuda_plugin: restore: 9 CUDA process(es), 0 failed, x", ours}),
		  -1);
}

TEST(CriuLogExcerpt, PluginLinesAreOnlyOurs)
{
	std::string path = ::testing::TempDir() + "/criu-excerpt-test.log";
	FILE *f = std::fopen(path.c_str(), "w");
	ASSERT_NE(f, nullptr);
	std::fputs("(00.000001) a\n(00.000002) path /x/cuda_plugin: fake\n(00.000003) cuda_plugin: real\n", f);
	std::fclose(f);
	LogBlock b = criu_log_excerpt(path);
	ASSERT_EQ(b.lines.size(), 1u);
	EXPECT_EQ(b.lines[0], "(00.000003) cuda_plugin: real");
}

TEST(ProgressMessage, OnlyThePluginsProgressForm)
{
	EXPECT_TRUE(is_progress_message("checkpoint: 12.3 of 40.0 GiB (1.6 GB/s), 3 of 4 process(es) done"));
	EXPECT_TRUE(is_progress_message("restore: 64 MiB (0 MB/s), 0 of 1 process(es) done"));
	EXPECT_FALSE(is_progress_message(kSummary));
	EXPECT_FALSE(is_progress_message("checkpointing 2 CUDA process(es) in parallel"));
	EXPECT_FALSE(is_progress_message("lock: 1 of 1 process(es) done"));
	EXPECT_FALSE(is_progress_message(" process(es) done"));
}

TEST(LogFollower, NewCompleteLinesOnlyAndAgainAfterARestart)
{
	std::string path = ::testing::TempDir() + "/criu-follow-test.log";
	std::remove(path.c_str());
	LogFollower follow(path);
	EXPECT_TRUE(follow.new_lines().empty()); // not there yet
	FILE *f = std::fopen(path.c_str(), "w");
	ASSERT_NE(f, nullptr);
	std::fputs("one\ntw", f);
	std::fflush(f);
	EXPECT_EQ(follow.new_lines(), std::vector<std::string>{"one"});
	std::fputs("o\nthree\n", f);
	std::fflush(f);
	EXPECT_EQ(follow.new_lines(), (std::vector<std::string>{"two", "three"}));
	EXPECT_TRUE(follow.new_lines().empty());
	std::fclose(f);
	// Written anew (shorter): read from its start.
	f = std::fopen(path.c_str(), "w");
	ASSERT_NE(f, nullptr);
	std::fputs("new\n", f);
	std::fclose(f);
	EXPECT_EQ(follow.new_lines(), std::vector<std::string>{"new"});
}

} // namespace
} // namespace cuda_criu::cli::roundtrip
