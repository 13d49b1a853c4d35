// The restore session against the fake driver and host: finding the restored CUDA processes, restoring
// them at once, refusals before any driver call, failures that CRIU would ignore, the mapped GPU image's check.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <mutex>

#include "core/dump_session.h"
#include "core/restore_session.h"
#include "expect_result.h"
#include "fakes.h"
#include "session_fixture.h"

namespace cuda_criu::testing {
namespace {

TEST_F(RestoreTest, RestoresEveryCudaProcessAtTheFirstCall)
{
	add_cuda(20, CudaState::Checkpointed);
	add_cuda(21, CudaState::Checkpointed);
	host.stopped = {19, 20, 21};
	RestoreSession s(options, host, source(), image_with({20, 21}), true);
	auto r = s.resume(19);
	ASSERT_TRUE(r.ok());
	EXPECT_TRUE(is_false(r));
	EXPECT_EQ(driver.state_of(20), CudaState::Running);
	EXPECT_EQ(driver.state_of(21), CudaState::Running);
	EXPECT_TRUE(is_true(s.resume(20)));
	EXPECT_TRUE(is_true(s.resume(21)));
	EXPECT_TRUE(host.running_threads.empty());
	EXPECT_FALSE(s.any_failed());
}

// Restored and unlocked, but its restore thread could not be stopped again: the process has its GPU
// state; it is not killed for the thread.
TEST_F(RestoreTest, FailedStopOfTheRestoreThreadKeepsTheRestoredProcess)
{
	add_cuda(20, CudaState::Checkpointed);
	host.stopped = {20};
	host.fail_stop = {1020};
	RestoreSession s(options, host, source(), image_with({20}), false);
	EXPECT_TRUE(is_true(s.resume(20)));
	EXPECT_EQ(driver.state_of(20), CudaState::Running);
	EXPECT_FALSE(s.any_failed());
	EXPECT_TRUE(host.killed.empty());
}

TEST_F(RestoreTest, FindsProcessesRestoredUnderNewPids)
{
	// Restored into a new pid namespace: host pids differ; the namespace pids match the image.
	add_cuda(5020, CudaState::Checkpointed);
	host.ns_pids[5020] = 20;
	host.stopped = {5019, 5020};
	RestoreSession s(options, host, source(), image_with({20}), true);
	EXPECT_TRUE(is_false(s.resume(5019)));
	EXPECT_EQ(driver.state_of(5020), CudaState::Running);
	EXPECT_TRUE(is_true(s.resume(5020)));
}

TEST_F(RestoreTest, ImageOfTheInTreePluginIsRestoredByDetection)
{
	add_cuda(20, CudaState::Checkpointed);
	host.stopped = {20, 21};
	RestoreSession s(options, host, source(), std::nullopt, true);
	EXPECT_TRUE(is_true(s.resume(20)));
	EXPECT_TRUE(is_false(s.resume(21)));
	EXPECT_EQ(driver.state_of(20), CudaState::Running);
}

TEST_F(RestoreTest, TooLittleFreeGpuMemoryRefusesBeforeAnyRestoreCall)
{
	add_cuda(20, CudaState::Checkpointed);
	host.stopped = {20};
	ImageRecord img = image_with({20});
	GpuInfo fake = driver.gpus()->front();
	img.gpus.push_back({fake.uuid, fake.name, fake.memory_bytes, "", 0});
	img.processes[0].gpu_uuids = {fake.uuid};
	img.processes[0].state_bytes = 3ULL << 30;
	driver.free[fake.uuid.str()] = 1ULL << 30;
	RestoreSession s(options, host, source(), img, true);
	auto r = s.resume(20);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("1.0 GiB free now"), std::string::npos) << r.error().message();
	EXPECT_EQ(driver.state_of(20), CudaState::Checkpointed) << "refused before the driver was asked to restore";
}

TEST_F(RestoreTest, GpusNoProcessHeldArePairedFromTheWholeMachine)
{
	// Dumped on GPU A (held) of a machine that also had GPU B; restored where CRIU's driver shows only the
	// fake GPU F (B hidden from it), while the kernel driver lists F and B: A -> F, and B, which no process
	// held, is paired with what is left of the whole machine (B itself).
	add_cuda(20, CudaState::Checkpointed);
	host.stopped = {20};
	GpuInfo f = driver.gpus()->front();
	GpuInfo a, b;
	a.uuid.bytes[0] = 0xa0;
	b.uuid.bytes[0] = 0xb0;
	a.name = b.name = f.name;
	host.all_gpus = {f, b};
	ImageRecord img = image_with({20});
	img.gpus.push_back({a.uuid, a.name, 0, "", 0});
	img.other_gpus.push_back({b.uuid, b.name, 0, "", 1});
	img.processes[0].gpu_uuids = {a.uuid};
	RestoreSession s(options, host, source(), img, true);
	ASSERT_TRUE(s.resume(20).ok());
	ASSERT_EQ(driver.last_pairs.size(), 2u);
	EXPECT_EQ(driver.last_pairs[0].from, a.uuid);
	EXPECT_EQ(driver.last_pairs[0].to, f.uuid);
	EXPECT_EQ(driver.last_pairs[1].from, b.uuid);
	EXPECT_EQ(driver.last_pairs[1].to, b.uuid);
	EXPECT_EQ(driver.state_of(20), CudaState::Running);
}

TEST_F(RestoreTest, FailureIsReturnedWhenCriuFailsTheRestore)
{
	add_cuda(20, CudaState::Checkpointed);
	host.stopped = {20};
	driver.fail["restore"] = {20};
	RestoreSession s(options, host, source(), image_with({20}), true);
	EXPECT_FALSE(s.resume(20).ok());
	EXPECT_TRUE(host.killed.empty());
}

TEST_F(RestoreTest, FailureKillsTheRestoredTasksWhenCriuWouldIgnoreIt)
{
	add_cuda(20, CudaState::Checkpointed);
	add_cuda(21, CudaState::Checkpointed);
	host.stopped = {19, 20, 21};
	driver.fail["unlock"] = {21};
	RestoreSession s(options, host, source(), image_with({20, 21}), false);
	EXPECT_TRUE(is_false(s.resume(19)));
	EXPECT_FALSE(s.resume(21).ok());
	EXPECT_EQ(host.killed, (std::set<pid_t>{19, 20, 21}));
}

// A failure of the hook outside the session (the driver's load timed out): on a CRIU that ignores it,
// every restored task is killed and the summary counts the failure; on ours, CRIU kills them.
TEST_F(RestoreTest, FailureOutsideTheSessionKillsWhenCriuWouldIgnoreIt)
{
	for (bool criu_fails : {false, true}) {
		host.killed.clear();
		add_cuda(20, CudaState::Checkpointed);
		host.stopped = {19, 20};
		RestoreSession s(options, host, source(), image_with({20}), criu_fails);
		s.abandon(19, make_error(ETIMEDOUT, "loading the CUDA driver gave no answer"));
		EXPECT_EQ(host.killed, criu_fails ? std::set<pid_t>() : std::set<pid_t>({19, 20}));
		EXPECT_NE(s.summary().find("1 failed"), std::string::npos) << s.summary();
		EXPECT_TRUE(s.any_failed());
		EXPECT_EQ(driver.state_of(20), CudaState::Checkpointed); // no driver call was made
	}
}

// A GPU image CRIU mapped (nothing to write) whose check is not done when the driver's restore starts:
// it runs on, and a process is unlocked only once it has passed. Here the check waits for the driver's
// restore call, so it cannot have ended before it, then fails: no process is unlocked, and the failure
// names the check. (Started at RESUME_DEVICES_LATE: as on a CRIU without POST_FORKING.)
TEST_F(RestoreTest, MappedImageStillBeingCheckedGatesTheUnlock)
{
	for (bool passes : {true, false}) {
		checkpointed_again(20);
		auto restored = [this] { return driver_restored(20); };
		GpuImageLoad check{[](const std::vector<GpuLoadTarget> &) -> Status {
					   return make_error(EIO, "%s", "a mapped process's chunks are not written");
				   },
				   [](pid_t) { return false; },
				   [&](const std::atomic<bool> &) -> Status {
					   for (int i = 0; i < 5000 && !restored(); i++)
						   usleep(1000);
					   if (!restored())
						   return make_error(EIO, "checked before the driver's restore");
					   if (!passes)
						   return make_error(EBADMSG, "chunk at 0x1000 fails its checksum");
					   return {};
				   },
				   {},
				   {}, {}};
		RestoreSession s(options, host, source(), image_with({20}), true, {}, check);
		auto r = s.resume(20);
		EXPECT_NE(s.summary().find("into the driver's restore"), std::string::npos) << s.summary();
		if (passes) {
			ASSERT_TRUE(r.ok()) << r.error().message();
			EXPECT_EQ(driver.state_of(20), CudaState::Running);
			continue;
		}
		ASSERT_FALSE(r.ok());
		EXPECT_NE(r.error().message().find("the GPU image CRIU maps failed its check; the processes are not unlocked"),
			  std::string::npos)
			<< r.error().message();
		EXPECT_NE(r.error().message().find("fails its checksum"), std::string::npos) << r.error().message();
		EXPECT_EQ(driver.state_of(20), CudaState::Locked);
	}
}

// A process whose compressed GPU state is decoded into memory CRIU maps: the driver's restore waits for
// the decode (the check), then that memory is given back; a failed decode restores nothing.
TEST_F(RestoreTest, DecodedProcessesAreRestoredOnlyOnceTheirStateIsDecoded)
{
	for (bool passes : {true, false}) {
		checkpointed_again(20);
		auto restored = [this] { return driver_restored(20); };
		std::atomic<bool> restored_during_check{false};
		std::vector<std::pair<pid_t, pid_t>> released;
		GpuImageLoad load{[](const std::vector<GpuLoadTarget> &) -> Status {
					  return make_error(EIO, "%s", "a mapped process's chunks are not written");
				  },
				  [](pid_t) { return false; },
				  [&](const std::atomic<bool> &) -> Status {
					  usleep(300000); // decoding
					  restored_during_check = restored();
					  if (!passes)
						  return make_error(EBADMSG, "chunk at 0x1000 does not decode");
					  return {};
				  },
				  [](pid_t ns_pid) { return ns_pid == 20; },
				  [&](pid_t ns_pid, pid_t pid) { released.emplace_back(ns_pid, pid); }, {}};
		RestoreSession s(options, host, source(), image_with({20}), true, {}, load);
		s.start_check([] {});
		auto r = s.resume(20);
		EXPECT_FALSE(restored_during_check) << "the driver read the memory before it was decoded";
		if (passes) {
			ASSERT_TRUE(r.ok()) << r.error().message();
			EXPECT_EQ(driver.state_of(20), CudaState::Running);
			EXPECT_EQ(released, (std::vector<std::pair<pid_t, pid_t>>{{20, 20}}));
			continue;
		}
		ASSERT_FALSE(r.ok());
		EXPECT_NE(r.error().message().find("does not decode"), std::string::npos) << r.error().message();
		EXPECT_FALSE(restored());
		EXPECT_TRUE(released.empty());
	}
}

// The pages of their mapped files the processes used at dump are read ahead while the driver restores,
// once the GPU image has been read (not before: they would delay it), at most a quarter of the memory
// available.
TEST_F(RestoreTest, MappedFilePagesAreReadAheadOnceTheGpuImageIsRead)
{
	add_cuda(5020, CudaState::Checkpointed);
	host.ns_pids[5020] = 20;
	host.stopped = {5020};
	host.available = uint64_t{8} << 30;
	ImageRecord image = image_with({20});
	image.processes[0].file_pages = {{0x400000, 0x420000}, {0x7f0000000000, 0x7f0000010000}};
	std::atomic<bool> read_ahead_during_check{false};
	GpuImageLoad load{[](const std::vector<GpuLoadTarget> &) -> Status { return {}; },
			  [](pid_t) { return false; },
			  [&](const std::atomic<bool> &) -> Status {
				  usleep(200000); // reading
				  std::lock_guard<std::mutex> g(host.file_pages_mu);
				  read_ahead_during_check = !host.read_aheads.empty();
				  return {};
			  },
			  [](pid_t) { return true; },
			  [](pid_t, pid_t) {}, {}};
	driver.delay_ms["restore"] = 300; // read ahead while it runs
	RestoreSession s(options, host, source(), image, true, {}, load);
	s.start_check([] {});
	auto r = s.resume(5020);
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_FALSE(read_ahead_during_check) << "read ahead while the GPU image was still being read";
	ASSERT_EQ(host.read_aheads.size(), 1u);
	EXPECT_EQ(host.read_aheads[0].pid, 5020);
	EXPECT_EQ(host.read_aheads[0].ranges, image.processes[0].file_pages);
	EXPECT_EQ(host.read_aheads[0].max_bytes, uint64_t{2} << 30);
}

// Started at POST_FORKING, the check of a mapped image is done before the restore hook: a pass lets the
// driver restore, a failure refuses every process before any driver call, still checkpointed.
TEST_F(RestoreTest, MappedImageCheckedWhileCriuRestoresMemoryDecidesBeforeTheDriver)
{
	for (bool passes : {true, false}) {
		checkpointed_again(20);
		std::atomic<bool> own_fs{false};
		std::atomic<bool> ran{false};
		GpuImageLoad check{[](const std::vector<GpuLoadTarget> &) -> Status {
					   return make_error(EIO, "%s", "a mapped process's chunks are not written");
				   },
				   [](pid_t) { return false; },
				   [&](const std::atomic<bool> &) -> Status {
					   ran = true;
					   if (!passes)
						   return make_error(EBADMSG, "chunk at 0x1000 fails its checksum");
					   return {};
				   },
				   {},
				   {}, {}};
		RestoreSession s(options, host, source(), image_with({20}), true, {}, check);
		s.start_check([&] { own_fs = true; });
		EXPECT_TRUE(own_fs); // before the hook returns
		for (int i = 0; i < 5000 && !ran; i++)
			usleep(1000);
		usleep(300000); // its result set, just after
		auto r = s.resume(20);
		EXPECT_NE(s.summary().find("while CRIU restored memory"), std::string::npos) << s.summary();
		if (passes) {
			ASSERT_TRUE(r.ok()) << r.error().message();
			EXPECT_EQ(driver.state_of(20), CudaState::Running);
			continue;
		}
		ASSERT_FALSE(r.ok());
		EXPECT_NE(r.error().message().find("fails its checksum"), std::string::npos) << r.error().message();
		EXPECT_EQ(driver.state_of(20), CudaState::Checkpointed);
		std::lock_guard<std::mutex> g(driver.mu);
		for (const std::string &c : driver.calls)
			EXPECT_EQ(c.rfind("restore", 0), std::string::npos) << c;
	}
}

// A restore that ends before its processes are found (CRIU failed) cancels the check still running and
// waits for it: its threads read the image directory CRIU is about to close.
TEST_F(RestoreTest, ASessionEndingCancelsTheMappedImagesCheck)
{
	std::atomic<bool> started{false}, cancelled{false};
	GpuImageLoad check{[](const std::vector<GpuLoadTarget> &) -> Status { return {}; }, [](pid_t) { return false; },
			   [&](const std::atomic<bool> &cancel) -> Status {
				   started = true;
				   for (int i = 0; i < 10000 && !cancel; i++)
					   usleep(1000);
				   cancelled = cancel.load();
				   return make_error(ECANCELED, "cancelled");
			   },
			   {},
			   {}, {}};
	auto t0 = std::chrono::steady_clock::now();
	{
		RestoreSession s(options, host, source(), image_with({20}), true, {}, check);
		s.start_check([] {});
		for (int i = 0; i < 5000 && !started; i++)
			usleep(1000);
	}
	EXPECT_TRUE(cancelled);
	EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(RestoreTest, ProcessOfTheImageWithoutRestoreThreadFails)
{
	host.cuda_pids.insert(20); // libcuda mapped, but the driver does not know it
	host.stopped = {20};
	RestoreSession s(options, host, source(), image_with({20}), true);
	EXPECT_FALSE(s.resume(20).ok());
}

} // namespace
} // namespace cuda_criu::testing
