// The restore's decisions at init(RESTORE) (core/restore_setup.h), against a fake host and an image
// directory of the test's own: which images make the plugin inactive, which are refused, and what the
// GPU image's preparation and the mapping requests ask of CRIU.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <tuple>
#include <vector>

#include "base/log.h"
#include "core/gpu_store.h"
#include "core/restore_setup.h"
#include "fakes.h"
#include "image/gpu_image.h"
#include "image/image.h"
#include "os/unique_fd.h"
#include "temp_dir.h"

namespace cuda_criu::testing {
namespace {

constexpr uint64_t kPage = 4096;

std::vector<std::string> g_lines;
void capture(LogLevel, const char *line) { g_lines.push_back(line); }

class RestoreSetupTest : public ::testing::Test {
protected:
	TempDir dir;
	FakeHost host;
	Options options;
	std::vector<std::string> taken;              // names taken off the inventory's list
	std::vector<std::string> listed{kPluginName}; // what the inventory lists
	std::vector<std::tuple<int, uint64_t, uint64_t>> mapped_ranges; // from the pages images
	std::vector<std::string> mapped_files;                          // from the GPU image's files
	CriuRestoreCalls criu;

	void SetUp() override
	{
		g_lines.clear();
		set_log_sink(capture);
		criu.image_dir = dir.fd();
		criu.take_from_inventory = [this](const char *name) {
			taken.emplace_back(name);
			for (const std::string &l : listed)
				if (l == name)
					return true;
			return false;
		};
		criu.map_from_image = [this](int pid, uint64_t start, uint64_t end) {
			mapped_ranges.emplace_back(pid, start, end);
			return 0;
		};
		criu.map_file = [this](int, uint64_t, uint64_t, const char *name, uint64_t) {
			mapped_files.emplace_back(name);
			return 0;
		};
	}
	void TearDown() override { set_log_sink(nullptr); }

	bool logged(const std::string &part) const
	{
		for (const auto &l : g_lines)
			if (l.find(part) != std::string::npos)
				return true;
		return false;
	}
	Result<RestoreSetup> set_up() { return set_up_restore(options, host, criu); }
	// The error of a refused set-up ("" when it was not refused).
	std::string refusal()
	{
		auto s = set_up();
		return s ? std::string() : s.error().message();
	}
	// An image of one CUDA process (image pid 7) dumped under driver 580.1, with its checkpoint range.
	ImageRecord record(const std::string &gpu_image_id = "", const std::string &checksums_id = "")
	{
		ImageRecord r;
		r.driver_version = "580.1";
		r.processes.push_back({4242, 7, CudaState::Running, {}, 0, 0, 0, {{0x100000, 0x300000}}});
		r.gpu_image_id = gpu_image_id;
		r.gpu_checksums_id = checksums_id;
		EXPECT_TRUE(write_image(dir.fd(), r).ok());
		return r;
	}
	// The GPU state of image pid 7 (2 chunks of data) as the plugin stores it, or only its checksums.
	GpuImageIndex gpu_image(const std::string &id, bool checksums_only = false)
	{
		host.memory[4242][0x100000] = 1;
		host.memory[4242][0x200000] = 2;
		std::vector<GpuSaveTarget> targets{{4242, 7, {{0x100000, 0x300000}}}};
		auto idx = checksums_only ? checksum_gpu_state(host, targets, id, 1) : save_gpu_state(host, dir.fd(), targets, id, 1);
		EXPECT_TRUE(idx.ok()) << idx.error().message();
		EXPECT_TRUE(write_gpu_index(dir.fd(), *idx).ok());
		return *idx;
	}
};

TEST_F(RestoreSetupTest, InactiveForAnImageWhoseInventoryNamesNoCudaPlugin)
{
	listed.clear();
	dir.write(kImageFileName, {1, 2, 3}); // not even read
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_FALSE(s->active);
	EXPECT_EQ(s->inherited, nullptr);
	EXPECT_TRUE(logged("the image holds no CUDA process; CUDA plugin inactive"));
}

TEST_F(RestoreSetupTest, AnImageOfCriusOwnPluginRestores)
{
	criu.take_from_inventory = nullptr; // a CRIU whose inventory lists no plugins: ours counts as listed
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_TRUE(s->active);
	EXPECT_FALSE(s->image.has_value());
	EXPECT_NE(s->inherited, nullptr);
	EXPECT_FALSE(s->load_gpu);
	EXPECT_FALSE(s->maps_image);
}

TEST_F(RestoreSetupTest, InactiveWithoutTheDriverForAnImageWithoutCudaProcesses)
{
	host.driver = false;
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_FALSE(s->active);
	EXPECT_NE(s->inherited, nullptr); // forked children still get their placeholders
	EXPECT_TRUE(logged("no NVIDIA driver on this machine; CUDA plugin inactive"));
}

TEST_F(RestoreSetupTest, CudaProcessesAreRefusedWithoutTheDriver)
{
	host.driver = false;
	record();
	auto s = set_up();
	ASSERT_FALSE(s.ok());
	EXPECT_EQ(s.error().errno_value(), ENODEV);
	EXPECT_EQ(s.error().message(), "the image holds 1 CUDA process(es) (dumped with NVIDIA driver 580.1) but this "
				       "machine has no NVIDIA driver: restore on a machine with the driver and GPUs");
}

TEST_F(RestoreSetupTest, CudaProcessesAreRefusedUnderAnotherDriverVersion)
{
	record();
	host.kernel_version = "575.57.08";
	std::string why = refusal();
	EXPECT_EQ(why.rfind("cannot restore: the image was dumped under NVIDIA driver 580.1 and this machine runs 575.57.08",
			    0),
		  0u)
		<< why;
	host.kernel_version = "580.1";
	EXPECT_EQ(refusal(), "");
}

TEST_F(RestoreSetupTest, AnUnusableImageOrAPagesFileCutShortIsRefused)
{
	dir.write(kImageFileName, {1, 2, 3});
	EXPECT_EQ(refusal().rfind("cannot restore: the CUDA plugin's image is unusable", 0), 0u) << refusal();
	// A pagemap of 2 pages in pages-7.img, which is missing.
	std::string pm = std::string("\x19\x43\x56\x54\x25\x40\x08\x56\x02\x00\x00\x00\x08\x07", 14) +
			 std::string("\x05\x00\x00\x00\x08\x80\x20\x10\x02", 9);
	dir.write("pagemap-1.img", std::vector<uint8_t>(pm.begin(), pm.end()));
	EXPECT_NE(refusal().find("pages-7.img"), std::string::npos) << refusal();
	dir.write("pages-7.img", std::vector<uint8_t>(2 * kPage, 0x5a));
	record();
	EXPECT_EQ(refusal(), "");
}

TEST_F(RestoreSetupTest, CheckpointMemoryIsMappedFromThePagesImagesUnlessOff)
{
	record();
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_TRUE(s->active);
	ASSERT_TRUE(s->image.has_value());
	EXPECT_TRUE(s->maps_image);
	EXPECT_FALSE(s->load_gpu);
	EXPECT_EQ(mapped_ranges, (decltype(mapped_ranges){{7, 0x100000, 0x300000}}));
	EXPECT_TRUE(mapped_files.empty());

	mapped_ranges.clear();
	options.map_image = false;
	s = set_up();
	ASSERT_TRUE(s.ok());
	EXPECT_FALSE(s->maps_image);
	EXPECT_TRUE(mapped_ranges.empty());
}

TEST_F(RestoreSetupTest, ThePluginsGpuImageIsCheckedMappedAndTakenOffTheInventory)
{
	std::string id = new_gpu_image_id();
	record(id);
	EXPECT_NE(refusal().find("cuda-gpu.img is missing from the image directory, which cuda-plugin.img names (the "
				 "GPU state is in the plugin's files)"),
		  std::string::npos)
		<< refusal();
	EXPECT_EQ(taken, (std::vector<std::string>{kPluginName, kGpuImageInventoryName}));

	GpuImageIndex idx = gpu_image(id);
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_TRUE(s->active);
	EXPECT_TRUE(s->maps_image);
	EXPECT_TRUE(mapped_ranges.empty()); // the pages images hold no GPU state
	EXPECT_FALSE(mapped_files.empty());
	ASSERT_TRUE(s->load_gpu);
	EXPECT_TRUE(s->load_gpu({{4242, 7, true}}).ok());
	EXPECT_FALSE(s->load_gpu.handled_before_restore(7)); // mapped: checked from POST_FORKING on, alongside CRIU
	ASSERT_TRUE(s->load_gpu.check_mapped);
	std::atomic<bool> cancel{false};
	EXPECT_TRUE(s->load_gpu.check_mapped(cancel).ok());
	cancel = true;
	EXPECT_EQ(s->load_gpu.check_mapped(cancel).error().errno_value(), ECANCELED);

	mapped_files.clear();
	criu.map_file = nullptr; // a CRIU without patch 0005: the chunks are written, not mapped
	s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_FALSE(s->maps_image);
	EXPECT_TRUE(s->load_gpu);
	EXPECT_TRUE(s->load_gpu.handled_before_restore(7));
	EXPECT_FALSE(s->load_gpu.check_mapped);

	dir.resize(idx.files.front().name, 100);
	EXPECT_EQ(refusal().rfind("cannot restore: the GPU image is incomplete", 0), 0u) << refusal();
}

// A compressed GPU image is decoded into memory the restore holds until the driver's restore: where the
// host's available memory cannot take it, the restore is refused before CRIU restores anything.
TEST_F(RestoreSetupTest, ACompressedImageThatCannotBeDecodedInMemoryIsRefusedFirst)
{
	std::string id = new_gpu_image_id();
	record(id);
	host.memory[4242][0x100000] = 1;
	host.memory[4242][0x200000] = 2;
	std::vector<GpuSaveTarget> targets{{4242, 7, {{0x100000, 0x300000}}}};
	auto idx = save_gpu_state(host, dir.fd(), targets, id, 1, kGpuChunkBytes, nullptr, 1);
	ASSERT_TRUE(idx.ok()) << idx.error().message();
	ASSERT_TRUE(write_gpu_index(dir.fd(), *idx).ok());
	int map_fd_calls = 0;
	criu.map_fd = [&](int, uint64_t, uint64_t, int, uint64_t) {
		map_fd_calls++;
		return 0;
	};
	host.available = 1 << 20; // less than the 2 MiB decoded
	EXPECT_EQ(refusal(), "cannot restore: the image's compressed GPU state decodes to 2.0 MiB, which the restore "
			     "holds in memory until the driver has restored it, and the host has 1.0 MiB available: "
			     "free memory, or restore fewer images at once");
	host.available = 64 << 20;
	map_fd_calls = 0;
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_TRUE(s->maps_image);
	EXPECT_EQ(map_fd_calls, 1);
	host.available.reset(); // unknown: not refused
	EXPECT_TRUE(set_up().ok());
}

// An incremental dump (criu dump --prev-images-dir) references unchanged chunks in its parent's files,
// which CRIU never maps: the plugin writes them, so the process counts as written into even where its
// own chunks are mapped, and all of its chunks are handled before the driver's restore.
TEST_F(RestoreSetupTest, ChunksInAParentsFilesAreWrittenEvenWhereTheImageIsMapped)
{
	ASSERT_EQ(mkdir(dir.file("parent").c_str(), 0700), 0);
	UniqueFd parent_dir(open(dir.file("parent").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	host.memory[4242][0x100000] = 1;
	host.memory[4242][0x200000] = 2;
	std::vector<GpuSaveTarget> targets{{4242, 7, {{0x100000, 0x300000}}}};
	auto first = save_gpu_state(host, parent_dir.get(), targets, new_gpu_image_id(), 1, 1 << 20); // 2 chunks
	ASSERT_TRUE(first.ok()) << first.error().message();
	ASSERT_TRUE(write_gpu_index(parent_dir.get(), *first).ok());
	host.memory[4242][0x200000] = 3; // its second chunk changed: stored (and mapped) anew, the first referenced
	auto parent = read_parent_gpu_image(dir.fd());
	ASSERT_TRUE(parent.ok() && *parent) << (parent.ok() ? "no parent image" : parent.error().message());
	std::string id = new_gpu_image_id();
	auto idx = save_gpu_state(host, dir.fd(), targets, id, 1, 1 << 20, &**parent);
	ASSERT_TRUE(idx.ok()) << idx.error().message();
	ASSERT_GT(idx->parent_bytes(), 0u);
	ASSERT_TRUE(write_gpu_index(dir.fd(), *idx).ok());
	record(id);
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	ASSERT_TRUE(s->maps_image); // its own chunk mapped
	ASSERT_TRUE(s->load_gpu);
	EXPECT_TRUE(s->load_gpu.handled_before_restore(7));
	EXPECT_FALSE(s->load_gpu.check_mapped);
}

TEST_F(RestoreSetupTest, AGpuImageOfAnotherDumpIsRefused)
{
	record(new_gpu_image_id());
	gpu_image(new_gpu_image_id());
	std::string why = refusal();
	EXPECT_NE(why.find("belongs to another dump"), std::string::npos) << why;
}

TEST_F(RestoreSetupTest, ChecksumsOfTheStateInThePagesImagesAreCheckedAndItIsMapped)
{
	std::string id = new_gpu_image_id();
	record("", id);
	gpu_image(id, true);
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_TRUE(s->maps_image);
	EXPECT_FALSE(mapped_ranges.empty());
	EXPECT_TRUE(mapped_files.empty());
	EXPECT_TRUE(s->load_gpu);
	EXPECT_EQ(taken, (std::vector<std::string>{kPluginName}));
}

TEST_F(RestoreSetupTest, AGpuIndexWithoutCudaPluginImg)
{
	gpu_image(new_gpu_image_id(), true); // checksums only: the state restores unchecked
	auto s = set_up();
	ASSERT_TRUE(s.ok()) << s.error().message();
	EXPECT_TRUE(s->active);
	EXPECT_FALSE(s->load_gpu);
	EXPECT_TRUE(logged("cuda-gpu.img holds checksums of the GPU state, but there is no cuda-plugin.img to name it"));

	gpu_image(new_gpu_image_id()); // the plugin's own GPU image cannot restore without its record
	EXPECT_EQ(refusal(), "cannot restore: the image directory holds a GPU image (cuda-gpu.img) but no "
			     "cuda-plugin.img: copy the whole image directory");
}

TEST_F(RestoreSetupTest, APidStillMappingTheImageIsWarnedAbout)
{
	host.fd_paths[dir.fd()] = "/images";
	host.maps[10] = {{{0x1000, 0x3000, "rw-p", 77, "/images/pages-1.img", {}}}};
	warn_if_image_still_mapped(host, dir.fd(), 10);
	EXPECT_TRUE(logged("pid 10 still maps the image after its GPU state was restored (0x1000-0x3000 of "
			   "/images/pages-1.img)"));
	g_lines.clear();
	warn_if_image_still_mapped(host, dir.fd(), 11);
	EXPECT_TRUE(g_lines.empty());
}

} // namespace
} // namespace cuda_criu::testing
