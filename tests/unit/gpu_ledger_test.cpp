// The machine's ledger of GPU memory reserved by restores in progress (os/gpu_ledger.h), and the restore's
// GPU plan counting what other restores reserved (core/restore_session.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/stat.h>

#include <fstream>
#include <map>
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

GpuUuid uuid_of(uint8_t first)
{
	GpuUuid u;
	u.bytes[0] = first;
	return u;
}

const GpuUuid kGpuA = uuid_of(0xaa);

ReserveDecision reserve(uint64_t bytes, pid_t process = 7, std::vector<GpuReservation> *seen = nullptr)
{
	return [=](const std::vector<GpuReservation> &others) -> Result<std::vector<GpuReservation>> {
		if (seen)
			*seen = others;
		return std::vector<GpuReservation>{{0, 0, kGpuA, bytes, process}};
	};
}

TEST(GpuLedger, ParsesItsLinesAndAnOlderVersionsAndRefusesAnythingElse)
{
	std::string a = kGpuA.str();
	auto e = parse_ledger("12 345 " + a + " 1024 7\n13 346 " + a + " 2048\n");
	ASSERT_TRUE(e);
	ASSERT_EQ(e->size(), 2u);
	EXPECT_EQ((*e)[0].owner, 12);
	EXPECT_EQ((*e)[0].owner_start, 345u);
	EXPECT_EQ((*e)[0].gpu, kGpuA);
	EXPECT_EQ((*e)[0].process, 7);
	EXPECT_EQ((*e)[1].bytes, 2048u);
	EXPECT_EQ((*e)[1].process, 0) << "an older version's line holds for its whole restore";
	for (const std::string &bad : std::vector<std::string>{"garbage\n", "0 1 " + a + " 5 1\n", "12 345 GPU-zz 1024 7\n",
				      "12 345 " + a + " 1024 7 8\n", "12 345 " + a + " 1024 x\n"})
		EXPECT_FALSE(parse_ledger(bad)) << bad;
}

TEST(GpuLedger, OthersThatLiveCountEntriesOfTheGoneOrUnreadableDoNot)
{
	testing::TempDir dir;
	GpuLedgerPlace place{dir.path() + "/ledger/gpu-reservations", 1000}; // its directory is made
	auto held = reserve_in_ledger(place, reserve(100));
	ASSERT_TRUE(held.ok());
	ASSERT_TRUE(*held);
	struct stat st {};
	ASSERT_EQ(stat((dir.path() + "/ledger").c_str(), &st), 0);
	EXPECT_EQ(st.st_mode & 07777, 0700u);
	ASSERT_EQ(stat(place.path.c_str(), &st), 0);
	EXPECT_EQ(st.st_mode & 07777, 0600u);
	// Another restore that lives (pid 1, its start time), one whose owner is gone (a start time that is not
	// pid 1's), one whose start time could not be read (0), added as other CRIUs would.
	{
		std::ofstream out(place.path, std::ios::app);
		out << "1 " << init_start_time() << " " << kGpuA.str() << " 700 3\n1 " << init_start_time() + 1 << " "
		    << kGpuA.str() << " 900 3\n1 0 " << kGpuA.str() << " 800 3\n";
	}
	std::vector<GpuReservation> seen;
	auto again = reserve_in_ledger(place, reserve(200, 7, &seen));
	ASSERT_TRUE(again.ok());
	ASSERT_EQ(seen.size(), 1u) << "this process's earlier reservation, a dead owner's and an unreadable one are not others";
	EXPECT_EQ(seen[0].owner, 1);
	EXPECT_EQ(seen[0].bytes, 700u);
	auto now = parse_ledger(read_all(place.path));
	ASSERT_TRUE(now);
	ASSERT_EQ(now->size(), 2u) << "the dead entries are dropped";
	EXPECT_EQ((*now)[1].owner, getpid());
	EXPECT_EQ((*now)[1].bytes, 200u);
	// A refusal records nothing for this process.
	EXPECT_FALSE(reserve_in_ledger(place, [](const std::vector<GpuReservation> &) -> Result<std::vector<GpuReservation>> {
			     return make_error(ENOSPC, "%s", "no room");
		     }).ok());
	EXPECT_EQ(parse_ledger(read_all(place.path))->size(), 1u);
}

TEST(GpuLedger, AReservationEndsProcessByProcessAndWithItsRestore)
{
	testing::TempDir dir;
	GpuLedgerPlace place{dir.path() + "/gpu-reservations", 1000};
	auto held = reserve_in_ledger(place, [](const std::vector<GpuReservation> &) -> Result<std::vector<GpuReservation>> {
		return std::vector<GpuReservation>{{0, 0, kGpuA, 100, 7}, {0, 0, kGpuA, 300, 8}};
	});
	ASSERT_TRUE(held.ok() && *held);
	(*held)->settle(7);
	auto now = parse_ledger(read_all(place.path));
	ASSERT_TRUE(now);
	ASSERT_EQ(now->size(), 1u);
	EXPECT_EQ((*now)[0].process, 8);
	(*held)->release();
	EXPECT_TRUE(parse_ledger(read_all(place.path))->empty());
	held->reset(); // a released reservation's end touches the ledger no more
	EXPECT_TRUE(parse_ledger(read_all(place.path))->empty());
}

TEST(GpuLedger, WithoutALedgerTheDecisionStillRuns)
{
	std::vector<GpuReservation> seen{{1, 1, kGpuA, 1, 1}};
	auto held = reserve_in_ledger({"/proc/no-such-dir/ledger", 100}, reserve(1, 7, &seen));
	ASSERT_TRUE(held.ok());
	EXPECT_FALSE(*held);
	EXPECT_TRUE(seen.empty());
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

// Two restores in progress keep their 8 GiB reserved past this one's restore-timeout (300 ms): it waited
// for them, asking again and again, and is refused by name once that time is up.
TEST_F(RestoreReservationTest, AReplicaThatNoLongerFitsBesideRestoresInProgressIsRefusedByName)
{
	host.ledger->entries = {{4001, 1, gpu.uuid, 4ULL << 30, 5}, {4002, 1, gpu.uuid, 4ULL << 30, 5}};
	int asked = 0;
	host.ledger->on_lock = [&asked] { asked++; };
	options.restore_timeout_ms = 300;
	RestoreSession s(options, host, source(), image, true);
	auto r = s.resume(20);
	ASSERT_FALSE(r.ok());
	const std::string why = r.error().message();
	EXPECT_NE(why.find("has 2.0 GiB free now"), std::string::npos) << why;
	EXPECT_NE(why.find("restores in progress on this machine, which have reserved 8.0 GiB of " + gpu.uuid.str() +
			   " by CRIU pid(s) 4001, 4002); it waited 0.3 s for the restores in progress to end"),
		  std::string::npos)
		<< why;
	EXPECT_GE(asked, 3) << "asked again while the others were restoring";
	EXPECT_EQ(driver.state_of(20), CudaState::Checkpointed) << "refused before the driver was asked to restore";
	EXPECT_EQ(host.ledger->entries.size(), 2u) << "a refused restore reserves nothing";
}

TEST_F(RestoreReservationTest, AReplicaThatFitsReservesItsStateUntilItIsRestored)
{
	host.ledger->entries = {{4001, 1, gpu.uuid, 4ULL << 30, 5}};
	options.ledger = "/run/test-ledger";
	options.ledger_timeout_ms = 1500;
	RestoreSession s(options, host, source(), image, true);
	ASSERT_TRUE(s.resume(20).ok());
	EXPECT_EQ(driver.state_of(20), CudaState::Running);
	EXPECT_EQ(host.ledger->place.path, "/run/test-ledger");
	EXPECT_EQ(host.ledger->place.wait_ms, 1500u);
	ASSERT_EQ(host.ledger->reserved.size(), 1u);
	ASSERT_EQ(host.ledger->reserved[0].size(), 1u);
	EXPECT_EQ(host.ledger->reserved[0][0].gpu, gpu.uuid);
	EXPECT_EQ(host.ledger->reserved[0][0].bytes, 3ULL << 30);
	EXPECT_EQ(host.ledger->reserved[0][0].process, 20);
	EXPECT_EQ(host.ledger->settled, std::vector<pid_t>{20}) << "its reservation ends as its restore returns";
	ASSERT_EQ(host.ledger->entries.size(), 1u);
	EXPECT_EQ(host.ledger->entries[0].owner, 4001);
}

TEST_F(RestoreReservationTest, EachProcessOfATreeReservesItsOwnStateWhichEndsWithItsRestore)
{
	driver.add(30, CudaState::Checkpointed);
	host.cuda_pids.insert(30);
	host.stopped = {20, 30};
	image.processes.push_back({30, 30, CudaState::Running, {gpu.uuid}, 5ULL << 30, 0, 0});
	options.parallel = 1; // one after the other: 20's restore has returned while 30's runs
	driver.delay_ms["restore"] = 50;
	RestoreSession s(options, host, source(), image, true);
	ASSERT_TRUE(s.resume(20).ok());
	ASSERT_EQ(host.ledger->reserved.size(), 1u);
	std::map<pid_t, uint64_t> by_process;
	for (const GpuReservation &r : host.ledger->reserved[0])
		by_process[r.process] += r.bytes;
	EXPECT_EQ(by_process, (std::map<pid_t, uint64_t>{{20, 3ULL << 30}, {30, 5ULL << 30}}));
	EXPECT_EQ(host.ledger->settled, (std::vector<pid_t>{20, 30}));
	EXPECT_TRUE(host.ledger->entries.empty());
}

// Another CRIU (4001) restores pid 7000 with 4 GiB reserved, of which the driver has allocated 3 GiB so
// far: the GPU's free memory (5 GiB) already lacks those 3 GiB, so only 1 GiB of the reservation is still to
// come and this restore's 3 GiB fit. Counted twice (free memory and the whole reservation) they would not.
TEST_F(RestoreReservationTest, WhatARestoreInProgressHasAllocatedCountsOnce)
{
	driver.free[gpu.uuid.str()] = 5ULL << 30;
	driver.usage_on[gpu.uuid.str()] = {{7000, 3ULL << 30}, {20, 0}};
	host.descendants = {{7000, 4001}};
	host.ledger->entries = {{4001, 1, gpu.uuid, 4ULL << 30, 7000}};
	RestoreSession s(options, host, source(), image, true);
	ASSERT_TRUE(s.resume(20).ok());
	EXPECT_EQ(driver.state_of(20), CudaState::Running);

	// The same entry, but pid 7000 is not a process that CRIU restores (a pid reused, an image's own
	// number): its reservation counts whole, and this restore is refused.
	driver.add(21, CudaState::Checkpointed);
	host.cuda_pids.insert(21);
	host.stopped = {21};
	host.descendants.clear();
	image.processes[0] = {21, 21, CudaState::Running, {gpu.uuid}, 3ULL << 30, 0, 0};
	options.restore_timeout_ms = 200; // how long it waits for the other restore to end
	RestoreSession refused(options, host, source(), image, true);
	auto r = refused.resume(21);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("which have reserved 4.0 GiB"), std::string::npos) << r.error().message();
	EXPECT_EQ(driver.state_of(21), CudaState::Checkpointed);
}

// In a pid namespace of its own (a container, a replica), a process has another pid in the image than on
// this machine: its entry names it by the pid here, whose GPU memory later restores can ask the driver for,
// and its reservation ends by that name.
TEST_F(RestoreReservationTest, AnEntryNamesTheProcessByItsPidOnThisMachine)
{
	image.processes[0] = {1, 1, CudaState::Running, {gpu.uuid}, 3ULL << 30, 0, 0};
	host.ns_pids[20] = 1;
	RestoreSession s(options, host, source(), image, true);
	ASSERT_TRUE(s.resume(20).ok());
	ASSERT_EQ(host.ledger->reserved.size(), 1u);
	ASSERT_EQ(host.ledger->reserved[0].size(), 1u);
	EXPECT_EQ(host.ledger->reserved[0][0].process, 20);
	EXPECT_EQ(host.ledger->settled, std::vector<pid_t>{20});
	EXPECT_TRUE(host.ledger->entries.empty());
}

// What the H200 showed: 4 replicas of 24.2 GiB fit a GPU of 139.8 GiB, but the last to decide saw 0.6 GiB
// free while the three others' driver restores ran, more than their reservations. Here another restore
// (4001, its process not one the driver tells) holds 8 GiB reserved and the GPU shows 2 GiB free; once its
// restore has returned, its reservation ends and 6 GiB are free: this one waits for that and is admitted,
// not refused.
TEST_F(RestoreReservationTest, ARestoreThatDoesNotFitBesideRestoresInProgressWaitsForThemToEnd)
{
	driver.free[gpu.uuid.str()] = 2ULL << 30;
	host.ledger->entries = {{4001, 1, gpu.uuid, 8ULL << 30, 7000}};
	int asked = 0;
	host.ledger->on_lock = [&] {
		if (++asked == 3) { // the other restore returned: what it holds shows in the free memory
			host.ledger->entries.clear();
			driver.free[gpu.uuid.str()] = 6ULL << 30;
		}
	};
	RestoreSession s(options, host, source(), image, true);
	ASSERT_TRUE(s.resume(20).ok());
	EXPECT_EQ(asked, 3);
	EXPECT_EQ(driver.state_of(20), CudaState::Running);
	ASSERT_EQ(host.ledger->reserved.size(), 1u) << "reserved once, when it fitted";
	EXPECT_EQ(host.ledger->reserved[0][0].bytes, 3ULL << 30);
}

// Alone on the GPU, a restore that does not fit is refused at once: nothing it could wait for.
TEST_F(RestoreReservationTest, ARestoreThatDoesNotFitWithNoOtherInProgressIsRefusedAtOnce)
{
	driver.free[gpu.uuid.str()] = 2ULL << 30;
	int asked = 0;
	host.ledger->on_lock = [&asked] { asked++; };
	RestoreSession s(options, host, source(), image, true);
	auto r = s.resume(20);
	ASSERT_FALSE(r.ok());
	EXPECT_EQ(asked, 1);
	EXPECT_NE(r.error().message().find("has 2.0 GiB free now"), std::string::npos) << r.error().message();
	EXPECT_EQ(r.error().message().find("waited"), std::string::npos) << r.error().message();
}

TEST_F(RestoreReservationTest, TheFreeMemoryIsReadUnderTheLedgersLock)
{
	// While this restore waited for the lock, another one took 8 GiB of the GPU's 10 GiB and ended its
	// reservation: the free memory read before the lock (10 GiB) would let this one in.
	host.ledger->on_lock = [this] { driver.free[gpu.uuid.str()] = 2ULL << 30; };
	RestoreSession s(options, host, source(), image, true);
	auto r = s.resume(20);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("has 2.0 GiB free now"), std::string::npos) << r.error().message();
	EXPECT_EQ(driver.state_of(20), CudaState::Checkpointed);
}

} // namespace
} // namespace cuda_criu
