// The dump's room preflight (core/space_check.h): the estimate and its floor, and the session's use of
// it before the first lock (refused, warned, off, unknown room, pages that go elsewhere).
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/dump_session.h"
#include "core/options.h"
#include "core/space_check.h"
#include "expect_result.h"
#include "fakes.h"

namespace cuda_criu::testing {
namespace {

constexpr uint64_t kMiB = 1ULL << 20;

std::vector<std::string> g_lines;
void capture(LogLevel, const char *line) { g_lines.push_back(line); }

bool logged(const std::string &part)
{
	return std::any_of(g_lines.begin(), g_lines.end(),
			   [&](const std::string &l) { return l.find(part) != std::string::npos; });
}

FreeSpace room(uint64_t free_mib) { return {free_mib * kMiB, 1024 * kMiB, "/images"}; }

ImageSpaceNeed need_of(uint64_t ordinary_mib, uint64_t gpu_mib, bool sparse = true)
{
	ImageSpaceNeed n;
	n.processes = 2;
	n.cuda_processes = 1;
	n.ordinary_bytes = ordinary_mib * kMiB;
	n.gpu_bytes = gpu_mib * kMiB;
	n.gpu_known = true;
	n.gpu_sparse = sparse;
	return n;
}

TEST(SpaceCheck, TheFloorLeavesOutTheGpuMemoryTheGpuImageMaySkip)
{
	ImageSpaceEstimate e = estimate_image_space(need_of(100, 400));
	EXPECT_EQ(e.floor, 100 * kMiB);
	EXPECT_EQ(e.estimate, 500 * kMiB);
	// gpu-image=criu: CRIU writes every page of the driver's copy, zeros included.
	e = estimate_image_space(need_of(100, 400, false));
	EXPECT_EQ(e.floor, 500 * kMiB);
	EXPECT_EQ(e.estimate, 500 * kMiB);
	// An incremental dump may write only part of the private memory: no floor from it.
	ImageSpaceNeed n = need_of(100, 400);
	n.ordinary_is_floor = false;
	EXPECT_EQ(estimate_image_space(n).floor, 0u);
	EXPECT_EQ(estimate_image_space(n).estimate, 500 * kMiB);
	// Without NVML only the private memory is known.
	n = need_of(100, 400);
	n.gpu_known = false;
	EXPECT_EQ(estimate_image_space(n).floor, 100 * kMiB);
	EXPECT_EQ(estimate_image_space(n).estimate, 100 * kMiB);
}

TEST(SpaceCheck, FitsWithoutAWord)
{
	ImageSpaceVerdict v = check_image_space(need_of(100, 400), room(600));
	EXPECT_TRUE(v.refusal);
	EXPECT_EQ(v.warning, "");
	EXPECT_NE(v.summary.find("/images has 600.0 MiB free"), std::string::npos) << v.summary;
	EXPECT_NE(v.summary.find("at least 100.0 MiB, up to 500.0 MiB"), std::string::npos) << v.summary;
}

TEST(SpaceCheck, OnlyTheEstimateOverTheRoomIsAWarning)
{
	ImageSpaceVerdict v = check_image_space(need_of(100, 400), room(300));
	EXPECT_TRUE(v.refusal);
	EXPECT_NE(v.warning.find("the image may not fit in /images: its file system has 300.0 MiB free"), std::string::npos)
		<< v.warning;
	EXPECT_NE(v.warning.find("at least 100.0 MiB and up to 500.0 MiB"), std::string::npos) << v.warning;
	EXPECT_NE(v.warning.find("all-zero pages are left out"), std::string::npos) << v.warning;
}

TEST(SpaceCheck, AFloorOverTheRoomIsRefusedWithTheFix)
{
	ImageSpaceVerdict v = check_image_space(need_of(100, 400), room(60));
	ASSERT_FALSE(v.refusal);
	EXPECT_EQ(v.refusal.error().errno_value(), ENOSPC);
	const std::string m = v.refusal.error().message();
	EXPECT_NE(m.find("not enough room for the image in /images: its file system has 60.0 MiB free, but this dump "
			 "writes at least 100.0 MiB there (up to 500.0 MiB; private memory 100.0 MiB of 2 process(es)"),
		  std::string::npos)
		<< m;
	EXPECT_NE(m.find("Free 40.0 MiB there, dump into a directory with room (criu dump -D), or set "
			 "CUDA_CRIU_SPACE_CHECK=warn"),
		  std::string::npos)
		<< m;
	// gpu-image=criu: the GPU memory is part of the floor.
	v = check_image_space(need_of(100, 400, false), room(300));
	ASSERT_FALSE(v.refusal);
	EXPECT_NE(v.refusal.error().message().find("written in full: gpu-image=criu"), std::string::npos);
}

// The session: the preflight runs at the first CUDA pid's pause, before its lock. Pids far above any
// real one: the tree walk finds no children of theirs in /proc.
class SpaceCheckSession : public ::testing::Test {
protected:
	static constexpr pid_t kPid = 3999001;
	static constexpr int kDirFd = 77;
	FakeDriver driver;
	FakeHost host;
	Options options;

	void SetUp() override
	{
		g_lines.clear();
		set_log_sink(capture);
		driver.running_threads = &host.running_threads;
		driver.add(kPid);
		host.cuda_pids.insert(kPid);
		host.anon[kPid] = 32 * kMiB;
		driver.usage = std::map<pid_t, uint64_t>{{kPid, 64 * kMiB}};
		options.memory_check = MemoryCheck::Off; // the host's own memory is not this test's business
	}
	void TearDown() override
	{
		driver.wait_idle();
		set_log_sink(nullptr);
	}

	DriverSource source()
	{
		return [this]() -> Result<Driver *> { return static_cast<Driver *>(&driver); };
	}

	bool locked() const
	{
		return std::find(driver.calls.begin(), driver.calls.end(), "lock " + std::to_string(kPid)) !=
		       driver.calls.end();
	}
};

TEST_F(SpaceCheckSession, TooLittleRoomIsRefusedBeforeAnyLock)
{
	host.space = room(16);
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	auto r = s.pause(kPid);
	ASSERT_FALSE(r);
	EXPECT_EQ(r.error().errno_value(), ENOSPC);
	EXPECT_NE(r.error().message().find("has 16.0 MiB free, but this dump writes at least 32.0 MiB there (up to "
					   "96.0 MiB"),
		  std::string::npos)
		<< r.error().message();
	EXPECT_EQ(host.space_asked, std::vector<int>{kDirFd});
	EXPECT_FALSE(locked());
	EXPECT_EQ(driver.state_of(kPid), CudaState::Running);
	EXPECT_FALSE(s.has_cuda_processes());
	EXPECT_TRUE(s.finish(true, false)); // nothing to return
	EXPECT_FALSE(locked());
}

TEST_F(SpaceCheckSession, GpuImageCriuRefusesWhatOnlyFitsWithoutTheGpuMemory)
{
	options.gpu_image = GpuImage::Criu;
	host.space = room(64); // 32 of private memory fit, 32 + 64 of GPU memory do not
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	auto r = s.pause(kPid);
	ASSERT_FALSE(r);
	EXPECT_EQ(r.error().errno_value(), ENOSPC);
	EXPECT_FALSE(locked());
}

TEST_F(SpaceCheckSession, AnEstimateOverTheRoomIsWarnedAndDumped)
{
	host.space = room(64); // the floor (32) fits, the estimate (96) does not
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	auto r = s.pause(kPid);
	ASSERT_TRUE(r) << r.error().message();
	EXPECT_TRUE(is_true(r));
	EXPECT_TRUE(locked());
	EXPECT_TRUE(logged("the image may not fit in /images")) << (g_lines.empty() ? "" : g_lines.back());
	EXPECT_TRUE(logged("space preflight: /images has 64.0 MiB free"));
	EXPECT_TRUE(s.finish(true, false));
	EXPECT_EQ(driver.state_of(kPid), CudaState::Running);
}

TEST_F(SpaceCheckSession, WarnDumpsWhatErrorWouldRefuse)
{
	options.space_check = SpaceCheck::Warn;
	host.space = room(16);
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	auto r = s.pause(kPid);
	ASSERT_TRUE(r) << r.error().message();
	EXPECT_TRUE(locked());
	EXPECT_TRUE(logged("not enough room for the image in /images"));
	EXPECT_TRUE(logged("(space-check=warn: dumping anyway)"));
	EXPECT_TRUE(s.finish(true, false));
}

TEST_F(SpaceCheckSession, OffAsksNothing)
{
	options.space_check = SpaceCheck::Off;
	host.space = room(0);
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	ASSERT_TRUE(s.pause(kPid));
	EXPECT_TRUE(locked());
	EXPECT_TRUE(host.space_asked.empty());
	EXPECT_FALSE(logged("space preflight"));
	EXPECT_TRUE(s.finish(true, false));
}

TEST_F(SpaceCheckSession, UnknownRoomIsSkippedAndLogged)
{
	host.space_error = make_error(ENOTSUP, "%s", "the file system of /images reports no size");
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	ASSERT_TRUE(s.pause(kPid));
	EXPECT_TRUE(locked());
	EXPECT_TRUE(logged("no space preflight: the room in the image directory is unknown (the file system of /images "
			   "reports no size)"));
	EXPECT_TRUE(s.finish(true, false));
}

TEST_F(SpaceCheckSession, PagesSentElsewhereAreNotCounted)
{
	host.space = room(1);
	host.args = {"criu", "dump", "-t", "1", "--lazy-pages"};
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	ASSERT_TRUE(s.pause(kPid));
	EXPECT_TRUE(logged("no space preflight: the pages do not go into the image directory (--lazy-pages)"));
	EXPECT_TRUE(host.space_asked.empty());
	EXPECT_TRUE(s.finish(true, false));
}

TEST_F(SpaceCheckSession, WithAPageServerOnlyTheGpuImageCounts)
{
	host.space = room(1); // the private memory (32 MiB) would not fit; it goes to the page server
	host.args = {"criu", "dump", "-t", "1", "--page-server", "--address", "10.0.0.2"};
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	auto r = s.pause(kPid);
	ASSERT_TRUE(r) << r.error().message();
	EXPECT_TRUE(logged("sent to the page server")) << (g_lines.empty() ? "" : g_lines.back());
	EXPECT_TRUE(logged("the image may not fit in /images")); // the GPU image's estimate (64 MiB)
	EXPECT_EQ(host.space_asked, std::vector<int>{kDirFd});
	EXPECT_TRUE(s.finish(true, false));
}

TEST_F(SpaceCheckSession, WithAPageServerAndGpuImageCriuNothingIsChecked)
{
	options.gpu_image = GpuImage::Criu; // the GPU state goes to the page server too
	host.space = room(1);
	host.args = {"criu", "dump", "-t", "1", "--page-server", "--address", "10.0.0.2"};
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	ASSERT_TRUE(s.pause(kPid));
	EXPECT_TRUE(logged("no space preflight: the pages do not go into the image directory (--page-server)"));
	EXPECT_TRUE(host.space_asked.empty());
	EXPECT_TRUE(s.finish(true, false));
}

TEST_F(SpaceCheckSession, WithoutNvmlThePrivateMemoryStillCounts)
{
	driver.usage.reset();
	host.space = room(16);
	DumpSession s(options, host, source(), {}, {}, kDirFd);
	auto r = s.pause(kPid);
	ASSERT_FALSE(r);
	EXPECT_NE(r.error().message().find("GPU memory of 1 CUDA process(es) unknown (no NVML)"), std::string::npos)
		<< r.error().message();
	EXPECT_FALSE(locked());
}

TEST_F(SpaceCheckSession, NoImageDirectoryNoCheck)
{
	host.space = room(0);
	DumpSession s(options, host, source());
	ASSERT_TRUE(s.pause(kPid));
	EXPECT_TRUE(host.space_asked.empty());
	EXPECT_TRUE(s.finish(true, false));
}

} // namespace
} // namespace cuda_criu::testing
