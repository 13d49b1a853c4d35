// The machine's ledger of GPU memory reserved by restores in progress (os/gpu_ledger.h), and the restore's
// GPU plan counting what other restores reserved (core/restore_session.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "core/restore_session.h"
#include "fakes.h"
#include "os/gpu_ledger.h"
#include "temp_dir.h"

namespace cuda_criu {
namespace {

using testing::FakeDriver;
using testing::FakeHost;

std::string read_all(const std::string &path)
{
	std::ifstream in(path);
	std::stringstream s;
	s << in.rdbuf();
	return s.str();
}

// pid 1's start time, as the ledger records a live owner.
uint64_t init_start_time()
{
	std::string stat = read_all("/proc/1/stat");
	std::istringstream in(stat.substr(stat.rfind(')') + 2));
	std::string field;
	for (int i = 3; i <= 22 && in >> field; i++)
		if (i == 22)
			return std::stoull(field);
	return 0;
}

TEST(GpuLedger, ParsesItsLinesAndSkipsOthers)
{
	auto e = parse_ledger("12 345 GPU-aa 1024\ngarbage\n0 1 GPU-bb 5\n13 346 GPU-cc 2048\n");
	ASSERT_EQ(e.size(), 2u);
	EXPECT_EQ(e[0].first.owner, 12);
	EXPECT_EQ(e[0].second, 345u);
	EXPECT_EQ(e[0].first.gpu, "GPU-aa");
	EXPECT_EQ(e[1].first.bytes, 2048u);
}

TEST(GpuLedger, OthersThatLiveCountTheirOwnAreReplacedAndReleased)
{
	testing::TempDir dir;
	std::string path = dir.path() + "/ledger/gpu-reservations"; // its directory is made
	ASSERT_TRUE(reserve_in_ledger(path, [](const std::vector<GpuReservation> &others) -> Result<std::vector<GpuReservation>> {
			    EXPECT_TRUE(others.empty());
			    return std::vector<GpuReservation>{{0, "GPU-aa", 100}};
		    }).ok());
	// Another restore that lives (pid 1, its start time), one whose owner is gone (a start time that is not
	// pid 1's), added as other CRIUs would.
	{
		std::ofstream out(path, std::ios::app);
		out << "1 " << init_start_time() << " GPU-aa 700\n1 " << init_start_time() + 1 << " GPU-aa 900\n";
	}
	std::vector<GpuReservation> seen;
	ASSERT_TRUE(reserve_in_ledger(path, [&](const std::vector<GpuReservation> &others) -> Result<std::vector<GpuReservation>> {
			    seen = others;
			    return std::vector<GpuReservation>{{0, "GPU-aa", 200}};
		    }).ok());
	ASSERT_EQ(seen.size(), 1u) << "this process's earlier reservation and a dead owner's are not others";
	EXPECT_EQ(seen[0].owner, 1);
	EXPECT_EQ(seen[0].bytes, 700u);
	auto now = parse_ledger(read_all(path));
	ASSERT_EQ(now.size(), 2u);
	EXPECT_EQ(now[1].first.owner, getpid());
	EXPECT_EQ(now[1].first.bytes, 200u);
	// A refusal records nothing for this process.
	EXPECT_FALSE(reserve_in_ledger(path, [](const std::vector<GpuReservation> &) -> Result<std::vector<GpuReservation>> {
			     return make_error(ENOSPC, "%s", "no room");
		     }).ok());
	EXPECT_EQ(parse_ledger(read_all(path)).size(), 1u);
	release_in_ledger(path);
	EXPECT_EQ(parse_ledger(read_all(path)).size(), 1u) << "the other restore's stays";
}

TEST(GpuLedger, WithoutALedgerTheDecisionStillRuns)
{
	bool asked = false;
	EXPECT_TRUE(reserve_in_ledger("/proc/no-such-dir/ledger", [&](const std::vector<GpuReservation> &others)
						      -> Result<std::vector<GpuReservation>> {
			    asked = others.empty();
			    return std::vector<GpuReservation>{};
		    }).ok());
	EXPECT_TRUE(asked);
}

class RestoreReservationTest : public ::testing::Test {
protected:
	FakeDriver driver;
	FakeHost host;
	Options options;
	GpuInfo gpu;
	ImageRecord image;

	void SetUp() override
	{
		driver.running_threads = &host.running_threads;
		gpu = driver.gpus()->front();
		driver.add(20, CudaState::Checkpointed);
		host.cuda_pids.insert(20);
		host.stopped = {20};
		image.version = 1;
		image.processes.push_back({20, 20, CudaState::Running, {gpu.uuid}, 3ULL << 30, 0, 0});
		image.gpus.push_back({gpu.uuid, gpu.name, gpu.memory_bytes, "", 0});
		driver.free[gpu.uuid.str()] = 10ULL << 30;
	}
	DriverSource source()
	{
		return [this]() -> Result<Driver *> { return static_cast<Driver *>(&driver); };
	}
};

TEST_F(RestoreReservationTest, AReplicaThatNoLongerFitsBesideRestoresInProgressIsRefusedByName)
{
	host.ledger = {{4001, gpu.uuid.str(), 4ULL << 30}, {4002, gpu.uuid.str(), 4ULL << 30}};
	RestoreSession s(options, host, source(), image, true);
	auto r = s.resume(20);
	ASSERT_FALSE(r.ok());
	const std::string why = r.error().message();
	EXPECT_NE(why.find("has 2.0 GiB free now"), std::string::npos) << why;
	EXPECT_NE(why.find("restores in progress on this machine, which have reserved 8.0 GiB of " + gpu.uuid.str() +
			   " by CRIU pid(s) 4001, 4002"),
		  std::string::npos)
		<< why;
	EXPECT_EQ(driver.state_of(20), CudaState::Checkpointed) << "refused before the driver was asked to restore";
	EXPECT_EQ(host.ledger.size(), 2u) << "a refused restore reserves nothing";
}

TEST_F(RestoreReservationTest, AReplicaThatFitsReservesItsStateUntilItIsRestored)
{
	host.ledger = {{4001, gpu.uuid.str(), 4ULL << 30}};
	RestoreSession s(options, host, source(), image, true);
	ASSERT_TRUE(s.resume(20).ok());
	EXPECT_EQ(driver.state_of(20), CudaState::Running);
	ASSERT_EQ(host.reserved.size(), 1u);
	ASSERT_EQ(host.reserved[0].size(), 1u);
	EXPECT_EQ(host.reserved[0][0].gpu, gpu.uuid.str());
	EXPECT_EQ(host.reserved[0][0].bytes, 3ULL << 30);
	ASSERT_EQ(host.ledger.size(), 1u) << "its reservation is released once it is restored";
	EXPECT_EQ(host.ledger[0].owner, 4001);
}

} // namespace
} // namespace cuda_criu
