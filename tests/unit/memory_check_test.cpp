#include <gtest/gtest.h>

#include "core/memory_check.h"

namespace cuda_criu {
namespace {

constexpr uint64_t GiB = 1ULL << 30;

CgroupRoom cgroup(const char *path, uint64_t limit, uint64_t usage) { return {path, limit, usage}; }

TEST(MemoryCheck, FitsWhenEveryCgroupAndTheHostHaveRoom)
{
	std::vector<CheckpointNeed> needs = {{10, 2 * GiB, cgroup("/cg/a", 8 * GiB, 1 * GiB)},
					     {11, 3 * GiB, cgroup("/cg/a", 8 * GiB, 1 * GiB)},
					     {12, 4 * GiB, std::nullopt}};
	EXPECT_TRUE(check_checkpoint_memory(needs, 10 * GiB));
	EXPECT_TRUE(check_checkpoint_memory(needs, std::nullopt));
}

TEST(MemoryCheck, ProcessesOfOneCgroupAreSummedAgainstItsLimit)
{
	// Each fits alone (3 GiB of room), both together do not.
	std::vector<CheckpointNeed> needs = {{10, 2 * GiB, cgroup("/cg/ctr", 4 * GiB, 1 * GiB)},
					     {11, 2 * GiB, cgroup("/cg/ctr", 4 * GiB, 1 * GiB)}};
	Status st = check_checkpoint_memory(needs, 100 * GiB);
	ASSERT_FALSE(st);
	EXPECT_EQ(st.error().errno_value(), ENOMEM);
	const std::string m = st.error().message();
	EXPECT_NE(m.find("10 (2.0 GiB), 11 (2.0 GiB)"), std::string::npos) << m;
	EXPECT_NE(m.find("4.0 GiB in all"), std::string::npos) << m;
	EXPECT_NE(m.find("/cg/ctr has room for 3.0 GiB only (limit 4.0 GiB, in use 1.0 GiB)"), std::string::npos)
		<< m;
	EXPECT_NE(m.find("by at least 1.0 GiB"), std::string::npos) << m;
	EXPECT_NE(m.find("CUDA_CRIU_MEMORY_CHECK=warn"), std::string::npos) << m;
}

TEST(MemoryCheck, HostMemoryCoversAllProcesses)
{
	std::vector<CheckpointNeed> needs = {{10, 6 * GiB, std::nullopt}, {11, 6 * GiB, std::nullopt}};
	Status st = check_checkpoint_memory(needs, 8 * GiB);
	ASSERT_FALSE(st);
	EXPECT_NE(st.error().message().find("12.0 GiB in all, but this machine has 8.0 GiB available"),
		  std::string::npos)
		<< st.error().message();
}

TEST(MemoryCheck, ACgroupOverItsLimitHasNoRoom)
{
	std::vector<CheckpointNeed> needs = {{10, 1, cgroup("/cg/full", 1 * GiB, 2 * GiB)}};
	EXPECT_FALSE(check_checkpoint_memory(needs, std::nullopt));
}

} // namespace
} // namespace cuda_criu
