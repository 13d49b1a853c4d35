// The restore that maps the driver's copy of the GPU state from the image: what the dump records
// (os/maps.h, DumpSession), what the image keeps, the option, and what the restore asks CRIU for.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <tuple>
#include <vector>

#include "base/log.h"
#include "core/mapped_restore.h"
#include "core/options.h"
#include "core/dump_session.h"
#include "fakes.h"
#include "image/image.h"
#include "os/maps.h"

namespace cuda_criu::testing {
namespace {

std::vector<std::string> g_lines;
void capture(LogLevel, const char *line) { g_lines.push_back(line); }

bool logged(const std::string &part)
{
	for (const auto &l : g_lines)
		if (l.find(part) != std::string::npos)
			return true;
	return false;
}

class LogCapture : public ::testing::Test {
protected:
	void SetUp() override
	{
		g_lines.clear();
		set_log_sink(capture);
	}
	void TearDown() override { set_log_sink(nullptr); }
};

Mapping map(uint64_t start, uint64_t end, const char *perms, const char *path = "", uint64_t inode = 0)
{
	return {start, end, perms, inode, path, {}};
}

TEST(Maps, ParsesLinesWithAndWithoutPaths)
{
	auto m = parse_maps("55a0c0000000-55a0c0001000 r--p 00000000 fe:00 5432765    /usr/bin/app\n"
			    "7f0000000000-7f0000400000 rw-p 00000000 00:00 0 \n"
			    "7f0000400000-7f0000401000 rw-p 00000000 00:00 0                [anon:cuda]\n"
			    "7f1000000000-7f1000100000 rw-p 00005000 fe:00 77   /img/pages-1.img (deleted)\n"
			    "garbage\n");
	ASSERT_EQ(m.size(), 4u);
	EXPECT_EQ(m[0].start, 0x55a0c0000000u);
	EXPECT_EQ(m[0].path, "/usr/bin/app");
	EXPECT_FALSE(m[0].private_anon());
	EXPECT_EQ(m[1].end, 0x7f0000400000u);
	EXPECT_EQ(m[1].path, "");
	EXPECT_TRUE(m[1].private_anon());
	EXPECT_TRUE(m[2].private_anon());
	EXPECT_EQ(m[3].path, "/img/pages-1.img (deleted)");
	EXPECT_EQ(m[3].inode, 77u);
}

TEST(Maps, AddedPrivateAnonymousMemory)
{
	std::vector<Mapping> before = {
		map(0x1000, 0x3000, "rw-p"),                       // heap-like anonymous memory
		map(0x10000, 0x20000, "---p"),                     // a reservation made accessible later
		map(0x30000, 0x31000, "rw-s", "/dev/nvidia0", 9), // a device mapping replaced later
	};
	std::vector<Mapping> after = {
		map(0x1000, 0x8000, "rw-p"),                       // grew by 0x3000-0x8000 (merged new mmap)
		map(0x10000, 0x14000, "rw-p"), map(0x14000, 0x20000, "---p"),
		map(0x30000, 0x31000, "rw-p"),                     // was mapped before: not new
		map(0x40000, 0x50000, "rw-p"), map(0x50000, 0x60000, "rw-p"), // two new, adjacent: merged
		map(0x70000, 0x71000, "r--p", "/lib/x.so", 5),     // a file: never
		map(0x80000, 0x81000, "---p"), map(0x81000, 0x90000, "rw-p"), // new stack and its guard: left out
		map(0xa0000, 0xa1000, "-w-p"),                     // unreadable: left out
	};
	std::vector<MemoryRange> want = {{0x3000, 0x8000}, {0x40000, 0x60000}};
	EXPECT_EQ(added_private_anon(before, after), want);
	EXPECT_EQ(total_bytes(want), 0x5000u + 0x20000u);
	EXPECT_TRUE(added_private_anon(after, after).empty());
	EXPECT_TRUE(added_private_anon(before, {}).empty());
}

TEST(Maps, PagesImageMappings)
{
	std::vector<Mapping> maps = {
		map(0x1000, 0x2000, "rw-p", "/img/pages-1.img", 3),
		map(0x2000, 0x3000, "rw-p", "/img/pages-12.img (deleted)", 3),
		map(0x3000, 0x4000, "rw-p", "/img/pages-1.img.bak", 3),
		map(0x4000, 0x5000, "rw-p", "/other/pages-1.img", 3),
		map(0x5000, 0x6000, "rw-p", "/img/pages-.img", 3),
		map(0x6000, 0x7000, "rw-p", "/img/pagemap-1.img", 3),
	};
	auto found = pages_image_mappings(maps, "/img");
	ASSERT_EQ(found.size(), 2u);
	EXPECT_EQ(found[0].start, 0x1000u);
	EXPECT_EQ(found[1].start, 0x2000u);
	EXPECT_EQ(image_still_mapped(maps, "/img"),
		  "0x1000-0x2000 of /img/pages-1.img, 0x2000-0x3000 of /img/pages-12.img (deleted)");
	EXPECT_EQ(image_still_mapped(maps, "/none"), "");
}

TEST(MappedRestoreImage, RangesRoundTripAndOldImagesReadWithout)
{
	ImageRecord r;
	r.driver_version = "580.159.04";
	std::vector<MemoryRange> ranges = {{0x7f0000000000, 0x7f0000100000}, {0x7f2000000000, 0x7f2000001000}};
	std::vector<MemoryRange> files = {{0x400000, 0x420000}, {0x7f3000000000, 0x7f3000200000}};
	r.processes.push_back({4242, 7, CudaState::Running, {}, 1 << 20, 0, 0, ranges, files});
	r.processes.push_back({4243, 8, CudaState::Running, {}, 0, 0, 0}); // as every image before the fields existed
	auto bytes = encode_image(r);
	auto d = decode_image(bytes.data(), bytes.size());
	ASSERT_TRUE(d.ok()) << d.error().message();
	ASSERT_EQ(d->processes.size(), 2u);
	EXPECT_EQ(d->processes[0].checkpoint_ranges, r.processes[0].checkpoint_ranges);
	EXPECT_EQ(d->processes[0].file_pages, files);
	EXPECT_TRUE(d->processes[1].checkpoint_ranges.empty());
	EXPECT_TRUE(d->processes[1].file_pages.empty());
	EXPECT_EQ(d->version, 1u); // an added optional field: older plugins read these images (and ignore it)
}

TEST(MappedRestoreImage, EmptyRangeIsCorrupt)
{
	for (bool in_file_pages : {false, true}) {
		ImageRecord r;
		std::vector<MemoryRange> empty = {{0x1000, 0x2000}, {0x2000, 0x2000}};
		r.processes.push_back({4242, 7, CudaState::Running, {}, 0, 0, 0, in_file_pages ? std::vector<MemoryRange>{} : empty,
				       in_file_pages ? empty : std::vector<MemoryRange>{}});
		auto bytes = encode_image(r);
		auto d = decode_image(bytes.data(), bytes.size());
		ASSERT_FALSE(d.ok());
		EXPECT_NE(d.error().message().find("corrupt image: process 4242: an empty memory range 0x2000-0x2000"),
			  std::string::npos)
			<< d.error().message();
	}
}

TEST(MappedRestoreOption, AutoByDefaultOffOrError)
{
	auto o = load_options({});
	ASSERT_TRUE(o.ok());
	EXPECT_TRUE(o->map_image);
	o = load_options({{"CUDA_CRIU_MAP_IMAGE", "off"}});
	ASSERT_TRUE(o.ok());
	EXPECT_FALSE(o->map_image);
	o = load_options({{"CUDA_CRIU_MAP_IMAGE", "auto"}});
	ASSERT_TRUE(o.ok());
	EXPECT_TRUE(o->map_image);
	o = load_options({{"CUDA_CRIU_MAP_IMAGE", "on"}});
	ASSERT_FALSE(o.ok());
	EXPECT_NE(o.error().message().find("environment CUDA_CRIU_MAP_IMAGE: map-image: 'on' is neither auto nor off"),
		  std::string::npos)
		<< o.error().message();
}

ImageRecord two_processes()
{
	ImageRecord r;
	r.processes.push_back({4242, 7, CudaState::Running, {}, 0, 0, 0, {{0x1000, 0x3000}, {0x8000, 0x9000}}});
	r.processes.push_back({4243, 8, CudaState::Running, {}, 0, 0, 0, {{0x5000, 0x6000}}});
	return r;
}

using Calls = std::vector<std::tuple<int, uint64_t, uint64_t>>;

class MappedRestoreRequest : public LogCapture {};

TEST_F(MappedRestoreRequest, AsksForEveryRangeByThePidInTheImage)
{
	Calls calls;
	size_t n = request_mapped_restore(two_processes(), true, [&](int pid, uint64_t s, uint64_t e) {
		calls.emplace_back(pid, s, e);
		return 0;
	});
	EXPECT_EQ(n, 3u);
	EXPECT_EQ(calls, (Calls{{7, 0x1000, 0x3000}, {7, 0x8000, 0x9000}, {8, 0x5000, 0x6000}}));
	EXPECT_TRUE(logged("pid 7: asking CRIU to map its GPU state (0.0 MiB in 2 range(s)) from the image"));
	EXPECT_TRUE(logged("pid 8: asking CRIU to map its GPU state (0.0 MiB in 1 range(s)) from the image"));
}

TEST_F(MappedRestoreRequest, OffStockCriuAndOldImagesRestoreNormallyAndSayWhy)
{
	int calls = 0;
	MapFromImage count = [&](int, uint64_t, uint64_t) { return ++calls, 0; };
	EXPECT_EQ(request_mapped_restore(two_processes(), false, count), 0u);
	EXPECT_TRUE(logged("normal restore: mapping the GPU state from the image is off (CUDA_CRIU_MAP_IMAGE=off)"));
	EXPECT_EQ(request_mapped_restore(two_processes(), true, MapFromImage()), 0u);
	EXPECT_TRUE(logged("normal restore: this CRIU cannot map pages from the image"));
	ImageRecord old;
	old.processes.push_back({4242, 7, CudaState::Running, {}, 0, 0, 0});
	EXPECT_EQ(request_mapped_restore(old, true, count), 0u);
	EXPECT_TRUE(logged("normal restore: the image records no memory of the driver's checkpoint"));
	EXPECT_EQ(calls, 0);
}

TEST_F(MappedRestoreRequest, ARefusedRangeIsReadAsUsual)
{
	size_t n = request_mapped_restore(two_processes(), true, [](int pid, uint64_t s, uint64_t) {
		return pid == 7 && s == 0x1000 ? -EINVAL : 0;
	});
	EXPECT_EQ(n, 2u);
	EXPECT_TRUE(logged("pid 7: CRIU refused to map 0x1000-0x3000 from the image (Invalid argument); that memory is "
			   "read as usual"));
	EXPECT_TRUE(logged("pid 7: asking CRIU to map its GPU state (0.0 MiB in 1 range(s)) from the image"));
}

TEST(MappedRestoreDump, RecordsWhatTheCheckpointMappedPerProcess)
{
	FakeDriver driver;
	FakeHost host;
	driver.running_threads = &host.running_threads;
	for (pid_t pid : {10, 11}) {
		driver.add(pid);
		host.cuda_pids.insert(pid);
	}
	host.ns_pids[10] = 1;
	std::vector<Mapping> before = {map(0x1000, 0x2000, "rw-p")};
	host.maps[10] = {before, {map(0x1000, 0x2000, "rw-p"), map(0x7000, 0x9000, "rw-p")}};
	// 11: its maps cannot be read; nothing is recorded and the dump goes on
	DumpSession s(Options(), host, [&]() -> Result<Driver *> { return static_cast<Driver *>(&driver); });
	ASSERT_TRUE(s.pause(10).ok());
	ASSERT_TRUE(s.pause(11).ok());
	ASSERT_TRUE(s.checkpoint(10).ok());
	ImageRecord rec = s.image_record();
	ASSERT_EQ(rec.processes.size(), 2u);
	EXPECT_EQ(rec.processes[0].checkpoint_ranges, (std::vector<MemoryRange>{{0x7000, 0x9000}}));
	EXPECT_TRUE(rec.processes[1].checkpoint_ranges.empty());
}

} // namespace
} // namespace cuda_criu::testing
