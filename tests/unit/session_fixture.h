// The fixtures of the dump and restore session tests (session_test.cpp, restore_session_test.cpp): a fake
// driver and host, and the processes' helpers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "core/dump_session.h"
#include "core/restore_session.h"
#include "fakes.h"

namespace cuda_criu::testing {

class DumpTest : public ::testing::Test {
protected:
	FakeDriver driver;
	FakeHost host;
	Options options;
	int driver_loads = 0;

	void SetUp() override { driver.running_threads = &host.running_threads; }

	DriverSource source()
	{
		return [this]() -> Result<Driver *> {
			driver_loads++;
			return static_cast<Driver *>(&driver);
		};
	}

	void add_cuda(pid_t pid, CudaState s = CudaState::Running)
	{
		driver.add(pid, s);
		host.cuda_pids.insert(pid);
	}

	void add_cuda(std::initializer_list<pid_t> pids)
	{
		for (pid_t pid : pids)
			add_cuda(pid);
	}

	// The refusal of pid's pause ("" when it was not refused); the process must be left running.
	std::string pause_refusal(DumpSession &s, pid_t pid)
	{
		auto r = s.pause(pid);
		EXPECT_EQ(driver.state_of(pid), CudaState::Running) << "pid " << pid;
		return r ? std::string() : r.error().message();
	}

	// A machine of n GPUs of one model, GPU 0 the one the fake driver lists (the others hidden from CRIU's
	// driver, listed by the kernel driver only); their minors are their ordinals.
	std::vector<GpuInfo> machine_of(int n)
	{
		std::vector<GpuInfo> gpus{driver.gpus()->front()};
		for (int i = 1; i < n; i++) {
			GpuInfo g = gpus[0];
			g.uuid.bytes[0] = static_cast<uint8_t>(0xcc + i);
			gpus.push_back(g);
		}
		for (int i = 0; i < n; i++)
			gpus[i].ordinal = i;
		host.all_gpus = gpus;
		return gpus;
	}

	// pids paused, checkpointed and finished by one dump session; what its image records.
	ImageRecord dump_of(std::initializer_list<pid_t> pids)
	{
		DumpSession s(options, host, source());
		for (pid_t pid : pids)
			EXPECT_TRUE(s.pause(pid).ok()) << "pid " << pid;
		EXPECT_TRUE(s.checkpoint(*pids.begin()).ok());
		EXPECT_TRUE(s.finish(false, false).ok());
		return s.image_record();
	}

	// After a rollback: every one of pids runs again.
	void expect_running(std::initializer_list<pid_t> pids)
	{
		for (pid_t pid : pids)
			EXPECT_EQ(driver.state_of(pid), CudaState::Running) << "pid " << pid;
	}
};

class RestoreTest : public DumpTest {
protected:
	// A round of a test that restores pid more than once: it is checkpointed and stopped again, and the
	// driver's calls of the round before are forgotten.
	void checkpointed_again(pid_t pid)
	{
		add_cuda(pid, CudaState::Checkpointed);
		host.stopped = {pid};
		std::lock_guard<std::mutex> g(driver.mu);
		driver.calls.clear();
	}
	// Whether the driver's restore of pid has been called (from any thread).
	bool driver_restored(pid_t pid)
	{
		std::lock_guard<std::mutex> g(driver.mu);
		return std::find(driver.calls.begin(), driver.calls.end(), "restore " + std::to_string(pid)) !=
		       driver.calls.end();
	}

	ImageRecord image_with(std::vector<int> ns_pids)
	{
		ImageRecord r;
		r.version = 1;
		for (int p : ns_pids)
			r.processes.push_back({p, p, CudaState::Running, {}, 0, 0, 0});
		return r;
	}
};

} // namespace cuda_criu::testing
