#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/parallel.h"

namespace cuda_criu {
namespace {

TEST(Parallel, RunsJobsConcurrentlyAndKeepsOrder)
{
	std::atomic<int> running{0}, peak{0};
	std::vector<Job> jobs;
	for (int i = 0; i < 4; i++)
		jobs.push_back({"job", [&, i]() -> Status {
					int now = ++running;
					int p = peak.load();
					while (now > p && !peak.compare_exchange_weak(p, now)) {
					}
					std::this_thread::sleep_for(std::chrono::milliseconds(50));
					--running;
					if (i == 2)
						return make_error(EIO, "job %d failed", i);
					return {};
				}});
	auto r = run_jobs(std::move(jobs), 0, 0);
	ASSERT_EQ(r.size(), 4u);
	EXPECT_TRUE(r[0].ok());
	EXPECT_FALSE(r[2].ok());
	EXPECT_EQ(r[2].error().message(), "job: job 2 failed");
	EXPECT_EQ(peak.load(), 4);
}

TEST(Parallel, BoundLimitsConcurrency)
{
	std::atomic<int> running{0}, peak{0};
	std::vector<Job> jobs;
	for (int i = 0; i < 6; i++)
		jobs.push_back({"job", [&]() -> Status {
					int now = ++running;
					int p = peak.load();
					while (now > p && !peak.compare_exchange_weak(p, now)) {
					}
					std::this_thread::sleep_for(std::chrono::milliseconds(20));
					--running;
					return {};
				}});
	auto r = run_jobs(std::move(jobs), 2, 0);
	for (auto &s : r)
		EXPECT_TRUE(s.ok());
	EXPECT_LE(peak.load(), 2);
}

TEST(Parallel, HungJobTimesOutWithoutHoldingTheOthers)
{
	auto release = std::make_shared<std::atomic<bool>>(false);
	std::vector<Job> jobs;
	jobs.push_back({"checkpoint pid 7", [release]() -> Status {
				while (!*release)
					std::this_thread::sleep_for(std::chrono::milliseconds(5));
				return {};
			}});
	jobs.push_back({"checkpoint pid 8", []() -> Status { return {}; }});
	auto t0 = std::chrono::steady_clock::now();
	auto r = run_jobs(std::move(jobs), 0, 200);
	auto spent = std::chrono::steady_clock::now() - t0;
	*release = true;
	ASSERT_FALSE(r[0].ok());
	EXPECT_EQ(r[0].error().errno_value(), ETIMEDOUT);
	EXPECT_NE(r[0].error().message().find("checkpoint pid 7"), std::string::npos);
	EXPECT_TRUE(r[1].ok());
	EXPECT_LT(spent, std::chrono::seconds(5));
}

} // namespace
} // namespace cuda_criu
