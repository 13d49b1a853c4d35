// Work on a thread of its own (the restore's driver load): work that returns is waited for; a wedged one is given
// up once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "core/background.h"

namespace cuda_criu {
namespace {

TEST(Background, TakesItsOwnFsBeforeReturningAndIsWaitedFor)
{
	auto own_fs = std::make_shared<std::atomic<bool>>(false);
	auto w = Background::start([own_fs] { *own_fs = true; }, [] {}, 5000);
	EXPECT_TRUE(*own_fs);
	EXPECT_TRUE(w->wait(5000));
	EXPECT_TRUE(w->wait(0));
}

TEST(Background, AWedgedLoadIsGivenUpOnceAndNotWaitedForAgain)
{
	auto release = std::make_shared<std::atomic<bool>>(false);
	auto w = Background::start([] {}, [release] {
		while (!*release)
			std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}, 5000);
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_FALSE(w->wait(100));
	EXPECT_FALSE(w->wait(5000)); // given up: no second wait
	EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
	*release = true; // the thread ends; it holds its own share of the task
	for (int i = 0; i < 200 && !w->wait(0); i++)
		std::this_thread::sleep_for(std::chrono::milliseconds(5));
	EXPECT_TRUE(w->wait(0));
}

TEST(Background, DoneWithinWaitsEveryTimeUntilTheWorkReturns)
{
	auto release = std::make_shared<std::atomic<bool>>(false);
	auto w = Background::start([] {}, [release] {
		while (!*release)
			std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}, 5000);
	EXPECT_FALSE(w->done_within(50));
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_FALSE(w->done_within(50)); // waits again, unlike wait() after a wait in vain
	EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(40));
	*release = true;
	EXPECT_TRUE(w->done_within(5000));
}

} // namespace
} // namespace cuda_criu
