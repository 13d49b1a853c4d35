// The sessions against a slow or wedged driver, and CRIU's repeated or timed hooks.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/criu_errno.h"
#include "core/driver_calls.h"
#include "core/dump_session.h"
#include "core/restore_session.h"
#include "expect_result.h"
#include "fakes.h"

namespace cuda_criu::testing {
namespace {

class HardeningTest : public ::testing::Test {
protected:
	FakeDriver driver;
	FakeHost host;
	Options options;

	void SetUp() override { driver.running_threads = &host.running_threads; }
	// Abandoned calls touch the fakes when they return: let them before the fixture goes.
	void TearDown() override { driver.wait_idle(); }

	DriverSource source()
	{
		return [this]() -> Result<Driver *> { return static_cast<Driver *>(&driver); };
	}

	void add_cuda(pid_t pid, CudaState s = CudaState::Running)
	{
		driver.add(pid, s);
		host.cuda_pids.insert(pid);
	}

	static bool has(const Error &e, const char *text) { return e.message().find(text) != std::string::npos; }
};

uint64_t ms_since(std::chrono::steady_clock::time_point t0)
{
	return static_cast<uint64_t>(
		std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
}

// Run under ASan (build-asan): the late checkpoint used to write its time into the freed session.
TEST_F(HardeningTest, CheckpointReturningAfterTheSessionIsGoneTouchesNothingOfIt)
{
	options.checkpoint_timeout_ms = 100;
	driver.delay_ms["checkpoint"] = 600;
	add_cuda(10);
	{
		DumpSession s(options, host, source());
		ASSERT_TRUE(is_true(s.pause(10)));
		auto c = s.checkpoint(10);
		ASSERT_FALSE(c.ok());
		EXPECT_EQ(c.error().errno_value(), ETIMEDOUT);
		EXPECT_TRUE(s.finish(true, false).ok()); // unlocked while the checkpoint still sleeps
	}
	driver.wait_idle(); // the checkpoint returns now, into a session that no longer exists
	EXPECT_EQ(driver.state_of(10), CudaState::Running);
}

TEST_F(HardeningTest, RestoreReturningAfterTheSessionIsGoneTouchesNothingOfIt)
{
	options.restore_timeout_ms = 100;
	driver.delay_ms["restore"] = 600;
	add_cuda(20, CudaState::Checkpointed);
	host.stopped = {20};
	{
		RestoreSession s(options, host, source(), std::nullopt, true);
		auto r = s.resume(20);
		ASSERT_FALSE(r.ok());
		EXPECT_TRUE(has(r.error(), "restore pid 20: no answer from the driver")) << r.error().message();
	}
	driver.wait_idle();
	EXPECT_EQ(driver.state_of(20), CudaState::Checkpointed); // its thread was stopped again: the call failed
}

// CRIU pauses a pid again after a failed seize retry.
TEST_F(HardeningTest, SecondPauseOfAPidIsANoOp)
{
	add_cuda(10);
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	auto again = s.pause(10);
	ASSERT_TRUE(again.ok()) << again.error().message();
	EXPECT_TRUE(is_true(again));
	ASSERT_TRUE(is_true(s.checkpoint(10)));
	EXPECT_EQ(std::count(driver.calls.begin(), driver.calls.end(), "lock 10"), 1);
	EXPECT_EQ(std::count(driver.calls.begin(), driver.calls.end(), "checkpoint 10"), 1);
	EXPECT_EQ(s.image_record().processes.size(), 1u);
	EXPECT_TRUE(s.finish(false, true).ok());
	EXPECT_EQ(driver.state_of(10), CudaState::Running);
}

// A lock that hangs longer than CRIU's seize alarm leaves: the pause fails before the alarm, saying
// which timeout to raise, and the process is not left locked.
TEST_F(HardeningTest, HungLockFailsWithinCriusSeizeTimeout)
{
	driver.delay_ms["lock"] = 2500;
	add_cuda(10);
	auto start = std::chrono::steady_clock::now();
	auto alarm = [start] {
		uint64_t spent = ms_since(start);
		return static_cast<unsigned>(spent < 2000 ? 2000 - spent : 0); // criu dump --timeout 2
	};
	DumpSession s(options, host, source(), {}, alarm);
	auto r = s.pause(10);
	ASSERT_FALSE(r.ok());
	EXPECT_LT(ms_since(start), 1500u); // one second's margin before the alarm
	EXPECT_EQ(r.error().errno_value(), ETIMEDOUT);
	EXPECT_TRUE(has(r.error(), "criu dump --timeout")) << r.error().message();
	EXPECT_TRUE(has(r.error(), "lock pid 10")) << r.error().message();
	EXPECT_FALSE(s.has_cuda_processes());
}

// The budget is shared by every pause of the dump and by the driver load.
TEST_F(HardeningTest, SlowDriverLoadCountsAgainstTheSeizeTimeout)
{
	add_cuda(10);
	auto start = std::chrono::steady_clock::now();
	auto alarm = [start] {
		uint64_t spent = ms_since(start);
		return static_cast<unsigned>(spent < 1800 ? 1800 - spent : 0);
	};
	DriverSource slow = [this]() -> Result<Driver *> {
		std::this_thread::sleep_for(std::chrono::milliseconds(1200));
		return static_cast<Driver *>(&driver);
	};
	DumpSession s(options, host, slow, {}, alarm);
	auto r = s.pause(10);
	ASSERT_FALSE(r.ok());
	EXPECT_LT(ms_since(start), 1200u);
	EXPECT_TRUE(has(r.error(), "load the CUDA driver")) << r.error().message();
	EXPECT_TRUE(has(r.error(), "criu dump --timeout")) << r.error().message();
	std::this_thread::sleep_for(std::chrono::milliseconds(500)); // the load returns; nothing waits for it
}

TEST_F(HardeningTest, AlarmAlmostSpentFailsAtOnce)
{
	add_cuda(10);
	DumpSession s(options, host, source(), {}, [] { return 400u; });
	auto r = s.pause(10);
	ASSERT_FALSE(r.ok());
	EXPECT_TRUE(has(r.error(), "criu dump --timeout")) << r.error().message();
	EXPECT_TRUE(driver.calls.empty());
}

TEST_F(HardeningTest, NoAlarmMeansTheOptionsAlone)
{
	add_cuda(10);
	DumpSession s(options, host, source(), {}, [] { return 0u; });
	EXPECT_TRUE(is_true(s.pause(10)));
}

// A wedged state query names the call and the pid instead of holding CRIU's thread.
TEST_F(HardeningTest, WedgedStateQueryNamesTheCallAndPid)
{
	driver.delay_ms["state"] = 1500;
	add_cuda(10);
	DumpSession s(options, host, source(), {}, [] { return 1500u; });
	auto start = std::chrono::steady_clock::now();
	auto r = s.pause(10);
	ASSERT_FALSE(r.ok());
	EXPECT_LT(ms_since(start), 1200u);
	EXPECT_TRUE(has(r.error(), "query the CUDA state of pid 10: no answer from the driver")) << r.error().message();
}

TEST_F(HardeningTest, WedgedRestoreThreadQueryFailsTheRestore)
{
	driver.delay_ms["getrestoretid"] = 1500;
	add_cuda(10);
	DumpSession s(options, host, source(), {}, [] { return 1500u; });
	auto r = s.pause(10);
	ASSERT_FALSE(r.ok()); // not taken for a process without CUDA state
	EXPECT_TRUE(has(r.error(), "query the restore thread of pid 10")) << r.error().message();
}

TEST(CallWithin, AbandonsACallPastItsLimitAndKeepsItsResultSlotAlive)
{
	auto t0 = std::chrono::steady_clock::now();
	auto r = call_within<int>(100, "query something of pid 7", [] {
		std::this_thread::sleep_for(std::chrono::milliseconds(300));
		return Result<int>(5);
	});
	ASSERT_FALSE(r.ok());
	EXPECT_LT(ms_since(t0), 250u);
	EXPECT_EQ(r.error().errno_value(), ETIMEDOUT);
	EXPECT_NE(r.error().message().find("query something of pid 7"), std::string::npos);
	auto ok = call_within<int>(1000, "x", [] { return Result<int>(5); });
	ASSERT_TRUE(ok.ok());
	EXPECT_EQ(*ok, 5);
	std::this_thread::sleep_for(std::chrono::milliseconds(300)); // the abandoned call writes its slot
}

// A restore thread that cannot be stopped again after the call is its own fault, named with the thread: a
// call that succeeded is not reported as failed, nor a failed one as failed for that reason.
TEST_F(HardeningTest, FailedStopAfterACallIsReportedApartFromTheCall)
{
	add_cuda(7, CudaState::Locked);
	add_cuda(8, CudaState::Locked);
	driver.fail["checkpoint"] = {8};
	host.fail_stop = {1007, 1008};
	auto shared = std::make_shared<TimedDriver>(driver);
	std::vector<ProcJob> jobs;
	for (pid_t pid : {7, 8})
		jobs.push_back({pid, pid + 1000, "checkpoint pid " + std::to_string(pid),
				[pid](Driver &d) { return d.checkpoint(pid); }});
	std::vector<ProcResult> out = run_proc_jobs(host, shared, std::move(jobs), 0, 5000);
	ASSERT_EQ(out.size(), 2u);
	EXPECT_TRUE(out[0].status.ok()) << out[0].status.error().message();
	EXPECT_EQ(driver.state_of(7), CudaState::Checkpointed);
	ASSERT_TRUE(out[0].thread_error.has_value());
	EXPECT_TRUE(has(*out[0].thread_error, "restore thread 1007 exited while it ran")) << out[0].thread_error->message();
	ASSERT_FALSE(out[1].status.ok());
	EXPECT_TRUE(has(out[1].status.error(), "checkpoint pid 8: checkpoint failed")) << out[1].status.error().message();
	EXPECT_FALSE(has(out[1].status.error(), "restore thread")) << out[1].status.error().message();
	ASSERT_TRUE(out[1].thread_error.has_value());
	EXPECT_TRUE(has(*out[1].thread_error, "restore thread 1008")) << out[1].thread_error->message();
	EXPECT_TRUE(host.running_threads.empty());
}

TEST(FailureErrno, NeverTellsCriuNotMine)
{
	EXPECT_EQ(failure_errno(make_error(ENOTSUP, "x")), EIO);
	EXPECT_EQ(failure_errno(make_error(EOPNOTSUPP, "x")), EIO);
	EXPECT_EQ(failure_errno(make_error(0, "x")), EIO);
	EXPECT_EQ(failure_errno(make_error(ETIMEDOUT, "x")), ETIMEDOUT);
	EXPECT_EQ(failure_errno(make_error(ENOMEM, "x")), ENOMEM);
}

} // namespace
} // namespace cuda_criu::testing
