// What a dump refuses before the lock (core/dump_refusals.h): legacy CUDA IPC as the driver's files in
// /dev/shm show it, and the IPC files among a process's mappings (os/maps.h).
#include <gtest/gtest.h>

#include "core/dump_refusals.h"
#include "core/dump_session.h"
#include "fakes.h"

namespace cuda_criu {
namespace {

using testing::FakeDriver;
using testing::FakeHost;

TEST(IpcFiles, FoundInMapsOnceEach)
{
	auto maps = parse_maps("7f0000000000-7f0000014000 rw-s 00000000 00:1a 4242 /dev/shm/cuda.shm.0.1b4.1\n"
			       "7f0000020000-7f0000034000 rw-s 00000000 00:1a 4242 /dev/shm/cuda.shm.0.1b4.1\n"
			       "7f0000040000-7f0000054000 rw-s 00000000 00:1b 77 /dev/shm/cuda.shm.0.2a.1 (deleted)\n"
			       "7f0000060000-7f0000061000 rw-s 00000000 00:1a 99 /dev/shm/torch_436_1\n"
			       "7f0000070000-7f0000071000 rw-s 00000000 00:1a 98 /dev/shm/cuda.shm.notapid\n"
			       "7f0000080000-7f0000081000 rw-s 00000000 00:1a 97 /dev/shm/cuda.shm.0.xyz.1\n");
	auto files = cuda_ipc_files(maps);
	ASSERT_EQ(files.size(), 2u);
	EXPECT_EQ(files[0].path, "/dev/shm/cuda.shm.0.1b4.1");
	EXPECT_EQ(files[0].dev, "00:1a");
	EXPECT_EQ(files[0].inode, 4242u);
	EXPECT_EQ(files[0].named_pid, 0x1b4);
	EXPECT_EQ(files[1].path, "/dev/shm/cuda.shm.0.2a.1");
	EXPECT_EQ(files[1].named_pid, 0x2a);
}

class LegacyIpcTest : public ::testing::Test {
protected:
	FakeHost host;
	FakeDriver driver;
	Options options;

	void SetUp() override { driver.running_threads = &host.running_threads; }

	void add_cuda(pid_t pid)
	{
		driver.add(pid);
		host.cuda_pids.insert(pid);
	}
	// pid maps the IPC file that exporter's name (in its own pid namespace) gives.
	void maps_file_of(pid_t pid, pid_t exporter, uint64_t inode = 500)
	{
		char path[64];
		std::snprintf(path, sizeof(path), "/dev/shm/cuda.shm.0.%x.1", static_cast<unsigned>(exporter));
		host.ipc_files[pid].push_back({path, "00:1a", inode, exporter});
	}
	// pid created its IPC file, named by its pid in its own pid namespace: it maps it and holds it open.
	void exports(pid_t pid, uint64_t inode = 500)
	{
		maps_file_of(pid, host.task_info(pid).ns_pid, inode);
		host.open_inodes[pid].insert(inode);
	}
	// Pid 5001 exports in a pid namespace of its own, where it is pid 436; pid 436 of the host imports
	// its file.
	void importer_with_the_exporters_number()
	{
		host.ns_pids[5001] = 436;
		host.pid_namespaces[5001] = "pid:[4026532777]";
		exports(5001);
		maps_file_of(436, 436);
	}
	std::string refusal(pid_t pid)
	{
		Status st = refuse_legacy_ipc(host, pid);
		return st ? std::string() : st.error().message();
	}
};

TEST_F(LegacyIpcTest, ImporterIsRefusedNamingBothAndTheFile)
{
	exports(436);
	maps_file_of(437, 436);
	std::string why = refusal(437);
	EXPECT_NE(why.find("pid 437 maps /dev/shm/cuda.shm.0.1b4.1, the legacy CUDA IPC file of pid 436"), std::string::npos)
		<< why;
	EXPECT_NE(why.find("r610"), std::string::npos) << why;
}

TEST_F(LegacyIpcTest, ExporterWhoseFileAnotherProcessMapsIsRefused)
{
	exports(436);
	maps_file_of(437, 436);
	maps_file_of(438, 436);
	std::string why = refusal(436);
	EXPECT_NE(why.find("pid 436 exported GPU memory or an event through legacy CUDA IPC"), std::string::npos) << why;
	EXPECT_NE(why.find("pid 437, 438 map its IPC file /dev/shm/cuda.shm.0.1b4.1"), std::string::npos) << why;
}

TEST_F(LegacyIpcTest, ExporterAloneIsLetThrough)
{
	exports(436);
	maps_file_of(437, 436);
	host.dead.insert(437); // its importer is gone
	EXPECT_EQ(refusal(436), "");
	EXPECT_EQ(refusal(900), ""); // a process without IPC files
}

// Inside a container the file carries the exporter's pid in the container's pid namespace.
TEST_F(LegacyIpcTest, PidsOfAnotherNamespaceAreMatched)
{
	host.ns_pids[5001] = 7;
	host.ns_pids[5002] = 8;
	host.pid_namespaces[5001] = host.pid_namespaces[5002] = "pid:[4026532100]";
	exports(5001);
	maps_file_of(5002, 7);
	EXPECT_NE(refusal(5001).find("pid 5002 maps its IPC file"), std::string::npos) << refusal(5001);
	EXPECT_NE(refusal(5002).find("the legacy CUDA IPC file of pid 5001 (pid 7 in pid namespace pid:[4026532100])"),
		  std::string::npos)
		<< refusal(5002);
}

TEST_F(LegacyIpcTest, ImporterWithTheExportersNumberAsItsHostPidIsRefusedNamingTheExporter)
{
	importer_with_the_exporters_number();
	std::string why = refusal(436);
	EXPECT_NE(why.find("pid 436 maps /dev/shm/cuda.shm.0.1b4.1, the legacy CUDA IPC file of pid 5001 (pid 436 in "
			   "pid namespace pid:[4026532777]): it opened GPU memory or an event that pid 5001 exported"),
		  std::string::npos)
		<< why;
	why = refusal(5001);
	EXPECT_NE(why.find("pid 5001 exported GPU memory or an event through legacy CUDA IPC"), std::string::npos) << why;
	EXPECT_NE(why.find("pid 436 maps its IPC file /dev/shm/cuda.shm.0.1b4.1"), std::string::npos) << why;
}

// Once the exporter has exited the importer is still no exporter (it does not hold the file open): dumped
// as one alone, it would never restore.
TEST_F(LegacyIpcTest, ImporterWithTheExportersNumberIsRefusedOnceTheExporterExited)
{
	importer_with_the_exporters_number();
	host.dead.insert(5001);
	std::string why = refusal(436);
	EXPECT_NE(why.find("pid 436 maps /dev/shm/cuda.shm.0.1b4.1, the legacy CUDA IPC file of pid 436 as its own pid "
			   "namespace numbered it, which has exited"),
		  std::string::npos)
		<< why;
}

// A process that holds the file open but has another pid than its name carries (a child that inherited
// the exporter's fd and mapping) is no exporter either.
TEST_F(LegacyIpcTest, ChildHoldingTheExportersFdIsNoExporter)
{
	importer_with_the_exporters_number();
	host.ns_pids[5002] = 437;
	host.pid_namespaces[5002] = "pid:[4026532777]";
	maps_file_of(5002, 436);
	host.open_inodes[5002].insert(500);
	std::string why = refusal(5002);
	EXPECT_NE(why.find("pid 5002 maps /dev/shm/cuda.shm.0.1b4.1, the legacy CUDA IPC file of pid 5001"),
		  std::string::npos)
		<< why;
}

TEST_F(LegacyIpcTest, ExporterInItsNamespaceAloneIsLetThrough)
{
	importer_with_the_exporters_number();
	host.dead.insert(436);
	EXPECT_EQ(refusal(5001), "");
}

TEST_F(LegacyIpcTest, ImporterOfAnExporterThatExitedIsRefused)
{
	maps_file_of(437, 436);
	std::string why = refusal(437);
	EXPECT_NE(why.find("the legacy CUDA IPC file of pid 436 as its own pid namespace numbered it, which has exited"),
		  std::string::npos)
		<< why;
}

// The dump refuses an importer at its pause: nothing locked, and the exporter paused before it is
// returned by the rollback.
TEST_F(LegacyIpcTest, DumpRefusesThePairBeforeTheLock)
{
	add_cuda(436);
	add_cuda(437);
	exports(436);
	maps_file_of(437, 436);
	DumpSession s(options, host, [this]() -> Result<Driver *> { return static_cast<Driver *>(&driver); });
	auto r = s.pause(436);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("pid 437 map"), std::string::npos) << r.error().message();
	EXPECT_EQ(driver.state_of(436), CudaState::Running);
	EXPECT_EQ(driver.state_of(437), CudaState::Running);
	EXPECT_TRUE(s.finish(true, false).ok());
}

TEST_F(LegacyIpcTest, DumpOfAnExporterAloneLocksIt)
{
	add_cuda(436);
	exports(436);
	DumpSession s(options, host, [this]() -> Result<Driver *> { return static_cast<Driver *>(&driver); });
	ASSERT_TRUE(s.pause(436).ok());
	EXPECT_EQ(driver.state_of(436), CudaState::Locked);
	EXPECT_TRUE(s.finish(true, false).ok());
	EXPECT_EQ(driver.state_of(436), CudaState::Running);
}

} // namespace
} // namespace cuda_criu
