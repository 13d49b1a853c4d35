// The driver's checkpoint buffer (os/checkpoint_buffer.h): which mmap requests are it, and its populating.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "core/options.h"
#include "os/checkpoint_buffer.h"

namespace cuda_criu::testing {
namespace {

constexpr uint64_t kMiB = 1ULL << 20;

// The request the r580 driver makes (seen on the H200): 4.5 GiB, PROT_READ|PROT_WRITE,
// MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE, no fd.
MmapRequest driver_request()
{
	return {0, 4847979664ULL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0};
}

TEST(CheckpointBuffer, TheDriversRequestIsRecognised)
{
	EXPECT_TRUE(is_checkpoint_buffer(driver_request(), 64 * kMiB));
}

TEST(CheckpointBuffer, OnlyAFreshPrivatePopulatedWritableAnonymousMappingIsTaken)
{
	auto with = [](auto change) {
		MmapRequest r = driver_request();
		change(r);
		return is_checkpoint_buffer(r, 64 * kMiB);
	};
	EXPECT_FALSE(with([](MmapRequest &r) { r.flags &= ~static_cast<uint64_t>(MAP_POPULATE); }))
		<< "not populated: the driver touches it as it writes, nothing to win";
	EXPECT_FALSE(with([](MmapRequest &r) { r.addr = 0x200000; }))
		<< "an address asked for may be an existing mapping";
	EXPECT_FALSE(with([](MmapRequest &r) { r.flags |= MAP_FIXED; }));
	EXPECT_FALSE(with([](MmapRequest &r) { r.flags |= MAP_FIXED_NOREPLACE; }));
	EXPECT_FALSE(with([](MmapRequest &r) { r.flags = (r.flags & ~static_cast<uint64_t>(MAP_PRIVATE)) | MAP_SHARED; }))
		<< "shared memory is seen by others";
	EXPECT_FALSE(with([](MmapRequest &r) { r.flags &= ~static_cast<uint64_t>(MAP_ANONYMOUS); r.fd = 17; }))
		<< "a file's contents are not zeros";
	EXPECT_FALSE(with([](MmapRequest &r) { r.fd = 17; }));
	EXPECT_FALSE(with([](MmapRequest &r) { r.prot = PROT_READ; }));
	EXPECT_FALSE(with([](MmapRequest &r) { r.flags |= MAP_HUGETLB; }));
	EXPECT_FALSE(with([](MmapRequest &r) { r.len = 2 * kMiB; })) << "small mappings are left to the driver";
	EXPECT_TRUE(with([](MmapRequest &r) { r.len = 64 * kMiB; }));
}

TEST(CheckpointBuffer, PopulatingWritesZerosOverExactlyTheRange)
{
	const size_t len = 8 * kMiB + 12345, guard = 4096;
	void *m = mmap(nullptr, len + 2 * guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(m, MAP_FAILED);
	auto *p = static_cast<uint8_t *>(m);
	std::memset(p, 0xa5, len + 2 * guard);
	auto st = populate_process_memory(getpid(), reinterpret_cast<uint64_t>(p + guard), len, 4);
	ASSERT_TRUE(st.ok()) << st.error().message();
	for (size_t i = 0; i < len; i++)
		ASSERT_EQ(p[guard + i], 0) << "offset " << i;
	for (size_t i = 0; i < guard; i++) {
		ASSERT_EQ(p[i], 0xa5) << "before the range, offset " << i;
		ASSERT_EQ(p[guard + len + i], 0xa5) << "after the range, offset " << i;
	}
	munmap(m, len + 2 * guard);
}

TEST(CheckpointBuffer, PopulatingMemoryThatIsNotThereFailsNamingIt)
{
	// A 4 MiB hole between two reserved ranges: nothing the populating maps itself can land there.
	void *m = mmap(nullptr, 12 * kMiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(m, MAP_FAILED);
	auto hole = reinterpret_cast<uint64_t>(m) + 4 * kMiB;
	ASSERT_EQ(munmap(reinterpret_cast<void *>(hole), 4 * kMiB), 0);
	auto st = populate_process_memory(getpid(), hole, 4 * kMiB, 2);
	munmap(m, 12 * kMiB);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find(std::to_string(getpid())), std::string::npos) << st.error().message();
}

TEST(CheckpointBuffer, HugePagesOptionIsAutoOrOff)
{
	auto o = load_options({});
	ASSERT_TRUE(o.ok());
	EXPECT_TRUE(o->huge_pages);
	o = load_options({{"CUDA_CRIU_HUGE_PAGES", "off"}});
	ASSERT_TRUE(o.ok());
	EXPECT_FALSE(o->huge_pages);
	o = load_options({{"CUDA_CRIU_HUGE_PAGES", "yes"}});
	ASSERT_FALSE(o.ok());
	EXPECT_NE(o.error().message().find("huge-pages: 'yes' is neither auto nor off"), std::string::npos)
		<< o.error().message();
}

// The log line's pages: what the kernel's counters say of the populate, a fragmented host named.
TEST(CheckpointBuffer, ThePagesTheBufferGotAreSaid)
{
	BufferReport r;
	r.bytes = 8 * kHugePage;
	EXPECT_EQ(buffer_pages(r), "4 KiB pages");
	r.huge_pages = true;
	r.huge_faults = 8;
	EXPECT_EQ(buffer_pages(r), "huge pages");
	r.compact_stalls = 3;
	EXPECT_EQ(buffer_pages(r), "huge pages (3 compaction stalls: the host's free memory is fragmented)");
	r.huge_faults = 6;
	r.fallbacks = 2;
	EXPECT_EQ(buffer_pages(r), "huge pages for 75% of it (2 faults fell back to 4 KiB pages, 3 compaction stalls: "
				   "the host's free memory is fragmented)");
	r.huge_faults = 20; // another process's faults counted too: never more than all of it
	EXPECT_EQ(buffer_pages(r).rfind("huge pages for 100% of it", 0), 0U) << buffer_pages(r);
}

} // namespace
} // namespace cuda_criu::testing
