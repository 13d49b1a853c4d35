#include <fcntl.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <mutex>

#include "core/dump_session.h"
#include "image/image.h"
#include "core/restore_session.h"
#include "expect_result.h"
#include "fakes.h"
#include "session_fixture.h"

namespace cuda_criu::testing {
namespace {

TEST_F(DumpTest, NonCudaProcessCostsNoDriverCall)
{
	DumpSession s(options, host, source());
	auto r = s.pause(42);
	ASSERT_TRUE(r.ok());
	EXPECT_TRUE(is_false(r));
	auto c = s.checkpoint(42);
	ASSERT_TRUE(c.ok());
	EXPECT_TRUE(is_false(c));
	EXPECT_EQ(driver_loads, 0);
	EXPECT_TRUE(driver.calls.empty());
	EXPECT_FALSE(s.has_cuda_processes());
	EXPECT_TRUE(s.finish(false, false).ok());
}

TEST_F(DumpTest, LibcudaWithoutContextIsNotOurs)
{
	host.cuda_pids.insert(7); // libcuda mapped, but the driver does not know the process
	DumpSession s(options, host, source());
	auto r = s.pause(7);
	ASSERT_TRUE(r.ok());
	EXPECT_TRUE(is_false(r));
	EXPECT_TRUE(driver.calls.empty()); // only the restore-thread query, which is not a state change
}

// A driver error other than "no CUDA state" from the restore-thread query: the process may hold GPU state
// the plugin cannot see, so the pause fails, naming it, instead of dumping it as a plain process.
TEST_F(DumpTest, UnrecognisedCudaProcessFailsThePause)
{
	add_cuda(7);
	driver.fail["getrestoretid"] = {7};
	DumpSession s(options, host, source());
	std::string why = pause_refusal(s, 7);
	EXPECT_NE(why.find("pid 7 has libcuda loaded, but the driver cannot say"), std::string::npos) << why;
	EXPECT_FALSE(s.has_cuda_processes());
}

// Stand-ins for NVIDIA device files: a forked child whose files are its CUDA parent's (one open file);
// not for one that opened its own, nor for a process without libcuda (NVML alone), nor for a CUDA
// process that still holds one after its checkpoint.
TEST_F(DumpTest, StandInsOnlyForFilesInheritedFromACudaProcess)
{
	add_cuda(10);
	host.cuda_pids.insert({11, 12}); // libcuda mapped, no CUDA state
	host.held[10] = {10, {}, {{9, O_RDWR, "/dev/nvidiactl"}, {12, O_RDWR, "/dev/nvidia0"}}};
	host.held[11] = {11, {}, {{9, O_RDWR, "/dev/nvidiactl"}, {12, O_RDWR, "/dev/nvidia0"}}};
	host.held[12] = {12, {}, {{9, O_RDWR, "/dev/nvidiactl"}, {20, O_RDWR, "/dev/nvidia0"}}};
	host.open_files = {{{10, 9}, 1}, {{10, 12}, 2}, {{11, 9}, 1}, {{11, 12}, 2}, {{12, 9}, 1}, {{12, 20}, 3}};
	DumpSession s(options, host, source());
	ASSERT_TRUE(s.pause(10).ok());
	for (pid_t pid : {11, 12, 13}) {
		auto r = s.pause(pid);
		ASSERT_TRUE(r.ok()) << pid;
		EXPECT_TRUE(is_false(r));
	}
	EXPECT_TRUE(s.stand_ins_allowed(11).ok());
	auto own = s.stand_ins_allowed(12);
	ASSERT_FALSE(own.ok());
	EXPECT_NE(own.error().message().find("pid 12 holds the NVIDIA device file /dev/nvidia0 (fd 20)"),
		  std::string::npos)
		<< own.error().message();
	auto nvml = s.stand_ins_allowed(13); // never asked to the driver: no libcuda
	ASSERT_FALSE(nvml.ok());
	EXPECT_NE(nvml.error().message().find("pid 13 holds NVIDIA device files but does not use CUDA"),
		  std::string::npos);
	ASSERT_TRUE(s.checkpoint(10).ok());
	auto cuda = s.stand_ins_allowed(10);
	ASSERT_FALSE(cuda.ok());
	EXPECT_NE(cuda.error().message().find("still holds NVIDIA device files after its CUDA checkpoint"),
		  std::string::npos);
	EXPECT_TRUE(s.finish(true, false).ok());
}

// A stopped CUDA process is refused at once, named, before any state query (its restore thread is
// stopped too: the driver would wait for it until a timeout); nothing is locked.
TEST_F(DumpTest, StoppedCudaProcessIsRefusedAtOnce)
{
	add_cuda(7);
	host.stopped_pids.insert(7);
	DumpSession s(options, host, source());
	std::string why = pause_refusal(s, 7);
	EXPECT_NE(why.find("pid 7 is stopped"), std::string::npos) << why;
	EXPECT_NE(why.find("kill -CONT 7"), std::string::npos);
	EXPECT_TRUE(driver.calls.empty());
}

// One /dev/nvidiactl more than the driver's (and NVML's): the fd of a CUDA memory handle shared with another
// process; refused before the lock, naming the process.
TEST_F(DumpTest, SharedMemoryHandleIsRefusedBeforeTheLock)
{
	add_cuda({7, 8});
	host.held[7] = {7, {}, {{9, O_RDWR, "/dev/nvidiactl"}, {40, O_RDWR, "/dev/nvidiactl"}}};
	host.held[8] = {8, {}, {{9, O_RDWR, "/dev/nvidiactl"}, {40, O_RDWR, "/dev/nvidiactl"}}};
	host.nvml_pids.insert(8); // NVML's own nvidiactl: 8 holds nothing more
	DumpSession s(options, host, source());
	std::string why = pause_refusal(s, 7);
	EXPECT_NE(why.find("pid 7 holds 2 open /dev/nvidiactl files, 1 more than the CUDA driver opens"), std::string::npos)
		<< why;
	ASSERT_TRUE(s.pause(8).ok());
	EXPECT_EQ(driver.state_of(8), CudaState::Locked);
	EXPECT_TRUE(s.finish(true, false).ok());
}

// criu dump --stream: the plugin's files would never reach the streamer; a CUDA process refuses it.
TEST_F(DumpTest, StreamedDumpOfACudaProcessIsRefused)
{
	add_cuda(7);
	host.args = {"criu", "dump", "--stream", "-t", "7"};
	DumpSession s(options, host, source());
	std::string why = pause_refusal(s, 7);
	EXPECT_NE(why.find("--stream"), std::string::npos) << why;
}

TEST_F(DumpTest, CheckpointsAllAtFirstCallAndAnswersLaterCalls)
{
	add_cuda({10, 11, 12});
	DumpSession s(options, host, source());
	for (pid_t p : {10, 11, 12, 13})
		ASSERT_TRUE(s.pause(p).ok());
	EXPECT_EQ(driver.state_of(10), CudaState::Locked);
	auto first = s.checkpoint(10);
	ASSERT_TRUE(first.ok()) << first.error().message();
	EXPECT_TRUE(is_true(first));
	for (pid_t p : {10, 11, 12})
		EXPECT_EQ(driver.state_of(p), CudaState::Checkpointed);
	EXPECT_TRUE(host.running_threads.empty()) << "restore threads must be stopped again";
	size_t calls = driver.calls.size();
	EXPECT_TRUE(is_true(s.checkpoint(11)));
	EXPECT_TRUE(is_true(s.checkpoint(12)));
	EXPECT_TRUE(is_false(s.checkpoint(13)));
	EXPECT_EQ(driver.calls.size(), calls) << "later calls answer from the first";
	EXPECT_EQ(driver_loads, 1);

	// Default dump: the tasks are killed; nothing is rolled back.
	ASSERT_TRUE(s.finish(false, false).ok());
	EXPECT_EQ(driver.state_of(10), CudaState::Checkpointed);
	ImageRecord rec = s.image_record();
	ASSERT_EQ(rec.processes.size(), 3u);
	EXPECT_EQ(rec.processes[0].initial_state, CudaState::Running);
	EXPECT_EQ(rec.driver_version, "999.1");
}

// Which pages of its mapped files each process uses is noted for the restore's read-ahead, the image's
// room for them shared out among the processes.
TEST_F(DumpTest, ImageNotesThePagesOfMappedFilesEachProcessUses)
{
	add_cuda({10, 11});
	host.file_pages[10] = {{0x400000, 0x420000}, {0x7f0000000000, 0x7f0000010000}};
	ImageRecord rec = dump_of({10, 11});
	ASSERT_EQ(rec.processes.size(), 2u);
	EXPECT_EQ(rec.processes[0].file_pages, host.file_pages[10]);
	EXPECT_TRUE(rec.processes[1].file_pages.empty());
	EXPECT_EQ(host.file_pages_max, (std::vector<size_t>{kImageMaxFilePageRanges / 2, kImageMaxFilePageRanges / 2}));
}

TEST_F(DumpTest, ImageRecordsTheGpusHeldAndTheMachinesOthers)
{
	// The process holds /dev/nvidia0; the kernel driver lists a second GPU that CRIU's driver does not
	// show (hidden by CUDA_VISIBLE_DEVICES): it is recorded among the other GPUs.
	add_cuda(10);
	std::vector<GpuInfo> g = machine_of(2);
	host.minors[10] = {0};
	ImageRecord rec = dump_of({10});
	ASSERT_EQ(rec.gpus.size(), 1u);
	EXPECT_EQ(rec.gpus[0].uuid, g[0].uuid);
	EXPECT_EQ(rec.processes[0].gpu_uuids, std::vector<GpuUuid>{g[0].uuid});
	ASSERT_EQ(rec.other_gpus.size(), 1u);
	EXPECT_EQ(rec.other_gpus[0].uuid, g[1].uuid);
	EXPECT_EQ(rec.other_gpus[0].ordinal, -1) << "no CUDA ordinal: CRIU's driver did not list it";
}

TEST_F(DumpTest, AContainerGivenSomeGpusRecordsOnlyTheOthersItCouldReach)
{
	// Measured with runc on two H200s: the container's /dev had nvidia0 only; the driver, restoring it
	// onto GPU 1, refused a pair for GPU 1 (CUDA_ERROR_INVALID_VALUE), as the process never knew of it.
	add_cuda(10);
	std::vector<GpuInfo> g = machine_of(3);
	host.minors[10] = {0};
	host.reachable[10] = {0, 2};
	ImageRecord rec = dump_of({10});
	ASSERT_EQ(rec.gpus.size(), 1u);
	ASSERT_EQ(rec.other_gpus.size(), 1u) << "only the GPU whose node the container had";
	EXPECT_EQ(rec.other_gpus[0].uuid, g[2].uuid);
}

TEST_F(DumpTest, AGpuWhoseNodeIsOpenWithoutAContextIsNotHeld)
{
	// Measured with JAX under CUDA_VISIBLE_DEVICES=0 on two H200s: /dev/nvidia1 open, a context on GPU 0
	// only (NVML). GPU 1 is one the driver knew, not one the process used: restoring onto GPU 0 alone
	// must not need a second GPU.
	add_cuda({10, 11});
	std::vector<GpuInfo> g = machine_of(2);
	host.minors[10] = {0, 1};
	host.minors[11] = {0, 1};
	driver.contexts = std::map<pid_t, std::vector<GpuUuid>>{{10, {g[0].uuid}}}; // 11: in no list NVML gave
	ImageRecord rec = dump_of({10, 11});
	ASSERT_EQ(rec.processes.size(), 2u);
	EXPECT_EQ(rec.processes[0].gpu_uuids, std::vector<GpuUuid>{g[0].uuid});
	EXPECT_EQ(rec.processes[1].gpu_uuids, (std::vector<GpuUuid>{g[0].uuid, g[1].uuid})) << "unknown to NVML: its nodes";
}

// The checkpoint lets each restore thread run traced, for the driver's buffer (os/checkpoint_buffer.h):
// on huge pages where THP is not never; not at all with huge-pages=off; never for a rollback.
TEST_F(DumpTest, CheckpointTracesTheRestoreThreadsForTheDriversBuffer)
{
	add_cuda({10, 11});
	DumpSession s(options, host, source());
	for (pid_t p : {10, 11})
		ASSERT_TRUE(is_true(s.pause(p)));
	ASSERT_TRUE(is_true(s.checkpoint(10)));
	for (pid_t tid : {1010, 1011}) {
		ASSERT_TRUE(host.buffer_policies.count(tid)) << tid;
		ASSERT_TRUE(host.buffer_policies[tid].has_value()) << tid;
		EXPECT_TRUE(host.buffer_policies[tid]->huge_pages);
		EXPECT_GE(host.buffer_policies[tid]->threads, 1u);
		EXPECT_LE(host.buffer_policies[tid]->threads, 16u);
	}
	ASSERT_TRUE(s.finish(false, true).ok()); // --leave-running: the rollback lets the threads run untraced
	EXPECT_FALSE(host.buffer_policies[1010].has_value());
	expect_running({10, 11});
}

TEST_F(DumpTest, WithThpNeverTheBufferIsPopulatedOnSmallPages)
{
	host.thp = std::string("never");
	add_cuda(10);
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	ASSERT_TRUE(is_true(s.checkpoint(10)));
	ASSERT_TRUE(host.buffer_policies[1010].has_value());
	EXPECT_FALSE(host.buffer_policies[1010]->huge_pages);
	host.thp = make_error(ENOENT, "open /sys/kernel/mm/transparent_hugepage/enabled: No such file or directory");
	add_cuda(20);
	DumpSession s2(options, host, source());
	ASSERT_TRUE(is_true(s2.pause(20)));
	ASSERT_TRUE(is_true(s2.checkpoint(20)));
	ASSERT_TRUE(host.buffer_policies[1020].has_value());
	EXPECT_FALSE(host.buffer_policies[1020]->huge_pages) << "no THP in the kernel: small pages";
}

TEST_F(DumpTest, HugePagesOffLeavesTheBufferToTheDriver)
{
	options.huge_pages = false;
	add_cuda(10);
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	ASSERT_TRUE(is_true(s.checkpoint(10)));
	ASSERT_TRUE(host.buffer_policies.count(1010));
	EXPECT_FALSE(host.buffer_policies[1010].has_value());
}

TEST_F(DumpTest, LeaveRunningReturnsEveryProcessToItsState)
{
	add_cuda(10, CudaState::Running);
	add_cuda(11, CudaState::Locked);
	add_cuda(12, CudaState::Checkpointed);
	DumpSession s(options, host, source());
	for (pid_t p : {10, 11, 12})
		ASSERT_TRUE(is_true(s.pause(p)));
	for (pid_t p : {10, 11, 12})
		ASSERT_TRUE(is_true(s.checkpoint(p)));
	EXPECT_EQ(driver.state_of(12), CudaState::Checkpointed);
	ASSERT_TRUE(s.finish(false, true).ok());
	EXPECT_EQ(driver.state_of(10), CudaState::Running);
	EXPECT_EQ(driver.state_of(11), CudaState::Locked);
	EXPECT_EQ(driver.state_of(12), CudaState::Checkpointed);
	EXPECT_TRUE(host.running_threads.empty());
}

TEST_F(DumpTest, LockFailureFailsThePauseAndLeavesTheProcessRunning)
{
	add_cuda(10);
	driver.fail["lock"] = {10};
	DumpSession s(options, host, source());
	auto r = s.pause(10);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("lock pid 10"), std::string::npos) << r.error().message();
	EXPECT_EQ(driver.state_of(10), CudaState::Running);
	EXPECT_TRUE(s.finish(true, false).ok());
}

TEST_F(DumpTest, LockFailureOfASecondProcessRollsBackTheFirst)
{
	add_cuda({10, 11});
	driver.fail["lock"] = {11};
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	ASSERT_FALSE(s.pause(11).ok());
	ASSERT_TRUE(s.finish(true, false).ok());
	expect_running({10, 11});
}

TEST_F(DumpTest, CheckpointFailureOfOneProcessFailsTheDumpAndRollsBackAll)
{
	add_cuda({10, 11});
	driver.fail["checkpoint"] = {11};
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	ASSERT_TRUE(is_true(s.pause(11)));
	auto r = s.checkpoint(10);
	ASSERT_FALSE(r.ok()) << "a failure fails the first call";
	EXPECT_FALSE(s.checkpoint(11).ok());
	ASSERT_TRUE(s.finish(true, false).ok());
	expect_running({10, 11});
}

TEST_F(DumpTest, LaterCriuFailureRollsBackCheckpointedProcesses)
{
	add_cuda(10);
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	ASSERT_TRUE(is_true(s.checkpoint(10)));
	ASSERT_TRUE(s.finish(/*dump_failed=*/true, false).ok());
	EXPECT_EQ(driver.state_of(10), CudaState::Running);
	std::vector<std::string> want = {"lock 10", "checkpoint 10", "restore 10", "unlock 10"};
	EXPECT_EQ(driver.calls, want);
}

TEST_F(DumpTest, TargetDyingMidDumpIsReportedAndTheOthersRolledBack)
{
	add_cuda({10, 11});
	host.fail_let_run.insert(1011); // pid 11 died: its restore thread is gone
	host.dead.insert(11);
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	ASSERT_TRUE(is_true(s.pause(11)));
	auto r = s.checkpoint(10);
	ASSERT_FALSE(r.ok());
	auto r11 = s.checkpoint(11);
	ASSERT_FALSE(r11.ok());
	EXPECT_NE(r11.error().message().find("pid 11"), std::string::npos) << r11.error().message();
	ASSERT_TRUE(s.finish(true, false).ok());
	EXPECT_EQ(driver.state_of(10), CudaState::Running);
}

TEST_F(DumpTest, RollbackFailureIsReportedWithThePid)
{
	add_cuda(10);
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	ASSERT_TRUE(is_true(s.checkpoint(10)));
	driver.fail["restore"] = {10};
	Status st = s.finish(true, false);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("10"), std::string::npos);
}

// A restore thread that cannot be stopped again after a call that succeeded (run_proc_jobs reports it
// apart, ProcResult::thread_error): the call's effect counts. A checkpoint that went through is rolled
// back from checkpointed (not only unlocked, which the driver refuses); a rollback that went through is
// not reported as a process not returned.
TEST_F(DumpTest, FailedStopOfTheRestoreThreadDoesNotUndoTheCallsEffect)
{
	add_cuda(10);
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	host.fail_stop = {1010};
	auto r = s.checkpoint(10); // the checkpoint went through, but CRIU's copy cannot be trusted: the dump fails
	ASSERT_FALSE(r.ok());
	EXPECT_TRUE(s.finish(true, false).ok());
	EXPECT_EQ(driver.state_of(10), CudaState::Running);
	std::vector<std::string> want = {"lock 10", "checkpoint 10", "restore 10", "unlock 10"};
	EXPECT_EQ(driver.calls, want);
}

TEST_F(DumpTest, FailedStopOfTheRestoreThreadAfterTheRollbackIsNoReturnFailure)
{
	add_cuda(10);
	DumpSession s(options, host, source());
	ASSERT_TRUE(is_true(s.pause(10)));
	ASSERT_TRUE(is_true(s.checkpoint(10)));
	host.fail_stop = {1010};
	Status st = s.finish(true, false);
	EXPECT_TRUE(st.ok()) << st.error().message();
	EXPECT_EQ(driver.state_of(10), CudaState::Running);
}

TEST_F(DumpTest, FailedStateIsRefused)
{
	add_cuda(10, CudaState::Failed);
	DumpSession s(options, host, source());
	auto r = s.pause(10);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("failed"), std::string::npos);
}

TEST_F(DumpTest, DriverMissingFailsOnlyForCudaProcesses)
{
	host.cuda_pids.insert(10);
	DumpSession s(options, host, [] { return Result<Driver *>(make_error(ENOENT, "cannot load libcuda.so.1")); });
	EXPECT_TRUE(is_false(s.pause(9)));
	auto r = s.pause(10);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("pid 10 uses CUDA"), std::string::npos) << r.error().message();
}

TEST_F(DumpTest, ParallelismBoundIsHonoured)
{
	options.parallel = 1;
	for (pid_t p = 10; p < 16; p++)
		add_cuda(p);
	DumpSession s(options, host, source());
	for (pid_t p = 10; p < 16; p++)
		ASSERT_TRUE(is_true(s.pause(p)));
	ASSERT_TRUE(is_true(s.checkpoint(10)));
	for (pid_t p = 10; p < 16; p++)
		EXPECT_EQ(driver.state_of(p), CudaState::Checkpointed);
}

} // namespace
} // namespace cuda_criu::testing
