#include <gtest/gtest.h>

#include "core/progress.h"

namespace cuda_criu {
namespace {

constexpr uint64_t GiB = 1ULL << 30;
constexpr uint64_t S = 1000000;

TEST(Progress, LogsBytesOfExpectedRateAndProcessesDone)
{
	Progress p("checkpoint", {{10, 4 * GiB}, {11, 4 * GiB}}, 30 * S, 5 * S, 100 * S);
	p.observe(0, {1 * GiB, 100}, false, 100 * S + S / 2);
	EXPECT_FALSE(p.line(100 * S + S / 2)); // the first is due after a second
	auto l = p.line(101 * S);
	ASSERT_TRUE(l);
	// 1 GiB in 1 s = 1.07 GB/s
	EXPECT_EQ(*l, "checkpoint: 1.0 of 8.0 GiB (1.1 GB/s), 0 of 2 process(es) done");
	p.observe(0, {2 * GiB, 110}, false, 105 * S);
	p.observe(1, {0, 5}, false, 105 * S);
	EXPECT_FALSE(p.line(105 * S)); // then every 5 s
	l = p.line(106 * S);
	ASSERT_TRUE(l);
	// 1 GiB more in 5 s = 0.21 GB/s
	EXPECT_EQ(*l, "checkpoint: 2.0 of 8.0 GiB (215 MB/s), 0 of 2 process(es) done");
	p.observe(0, {3 * GiB, 120}, true, 110 * S);
	p.observe(1, {3 * GiB, 90}, false, 110 * S);
	l = p.line(111 * S);
	ASSERT_TRUE(l);
	// the finished one counts in full: 4 + 3 GiB; 5 GiB more in 5 s
	EXPECT_EQ(*l, "checkpoint: 7.0 of 8.0 GiB (1.1 GB/s), 1 of 2 process(es) done");
}

TEST(Progress, AStallIsNoBytesAndNoCpuForTheStallTime)
{
	Progress p("restore", {{10, 4 * GiB}, {11, 0}}, 3 * S, 5 * S, 0);
	p.observe(0, {1 * GiB, 10}, false, 1 * S);
	p.observe(1, {0, 0}, true, 1 * S);
	EXPECT_FALSE(p.stalled(3 * S));
	// CPU time alone is a sign of life
	p.observe(0, {1 * GiB, 11}, false, 3 * S);
	EXPECT_FALSE(p.stalled(5 * S));
	p.observe(0, {1 * GiB, 11}, false, 6 * S);
	auto s = p.stalled(6 * S);
	ASSERT_TRUE(s);
	EXPECT_EQ(*s, 0u);
	EXPECT_EQ(p.pid(*s), 10);
	EXPECT_EQ(p.stall_message(*s, 6 * S),
		  "the driver's restore made no progress for 3 s (the restore thread used no CPU time and no more bytes "
		  "were copied), stopped at 1.0 of 4.0 GiB");
}

TEST(Progress, NoStallDetectionWhenDisabledOrFinished)
{
	Progress off("checkpoint", {{10, GiB}}, 0, 5 * S, 0);
	EXPECT_FALSE(off.stalled(1000 * S));
	Progress done("checkpoint", {{10, GiB}}, 1 * S, 5 * S, 0);
	done.observe(0, {GiB, 1}, true, 1);
	EXPECT_FALSE(done.stalled(1000 * S));
}

TEST(Progress, AByteSignalThatNeverMovedDoesNotMakeAStall)
{
	Progress p("restore", {{10, 4 * GiB}}, 1 * S, 3 * S, 0, true);
	p.observe(0, {0, 5}, false, 1);
	EXPECT_FALSE(p.stalled(100 * S)); // no bytes seen yet: no stall on CPU time alone
	p.observe(0, {GiB, 5}, false, 101 * S);
	EXPECT_FALSE(p.stalled(101 * S));
	EXPECT_TRUE(p.stalled(103 * S)); // moved once, then stopped
}

TEST(Progress, NoStallWhileWaitingToBeginTheCopy)
{
	Progress p("checkpoint", {{10, GiB}}, 2 * S, 5 * S, 0);
	p.waiting(0, 3 * S); // its lock took 3 s
	EXPECT_FALSE(p.stalled(4 * S));
	p.observe(0, {0, 0}, false, 4 * S);
	EXPECT_TRUE(p.stalled(5 * S));
}

TEST(Progress, SmallPhasesInMiB)
{
	Progress p("restore", {{10, 256ULL << 20}}, 0, 3 * S, 10 * S);
	p.observe(0, {64ULL << 20, 1}, false, 11 * S);
	EXPECT_EQ(*p.line(11 * S), "restore: 64 of 256 MiB (67 MB/s), 0 of 1 process(es) done");
}

} // namespace
} // namespace cuda_criu
