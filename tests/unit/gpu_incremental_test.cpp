// An incremental GPU image (criu dump --prev-images-dir): chunks unchanged since the parent image are
// referenced in the parent's files instead of written, and the restore reads them from there.
#include <gtest/gtest.h>

#include <algorithm>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "core/gpu_store.h"
#include "core/mapped_restore.h"
#include "fakes.h"
#include "gpu_memory.h"
#include "image/gpu_image.h"
#include "temp_dir.h"

namespace cuda_criu::testing {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint32_t kChunk = 2 * kPage;

// Image directories d0, d1, d2 in one folder, each later one with CRIU's "parent" link to the one before;
// pid 10 has 4 chunks of data at 0x100000, pid 11 one chunk at 0x300000.
struct Chain {
	TempDir root;
	FakeHost host;
	std::vector<GpuSaveTarget> targets{{10, 1, {{0x100000, 0x100000 + 4 * kChunk}}}, {11, 2, {{0x300000, 0x300000 + kChunk}}}};
	std::vector<int> dirs;
	int zstd_level = 0; // the next dump's compression
	Chain()
	{
		for (int i = 0; i < 3; i++) {
			std::string d = root.file("d" + std::to_string(i));
			EXPECT_EQ(mkdir(d.c_str(), 0700), 0);
			if (i) {
				EXPECT_EQ(symlink(("../d" + std::to_string(i - 1)).c_str(), (d + "/parent").c_str()), 0);
			}
			dirs.push_back(open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
		}
		fill(host, 10, 0x100000, 4 * kChunk, 1);
		fill(host, 11, 0x300000, kChunk, 2);
	}
	~Chain()
	{
		for (int fd : dirs)
			close(fd);
	}
	// Dumps the memory as it is now into dirs[i] (against its parent image, if any) and writes the index.
	GpuImageIndex dump(int i)
	{
		auto parent = read_parent_gpu_image(dirs[i]);
		EXPECT_TRUE(parent.ok()) << parent.error().message();
		auto idx = save_gpu_state(host, dirs[i], targets, new_gpu_image_id(), 2, kChunk,
					  parent.ok() && *parent ? &**parent : nullptr, zstd_level);
		EXPECT_TRUE(idx.ok()) << idx.error().message();
		EXPECT_TRUE(write_gpu_index(dirs[i], *idx).ok());
		return *idx;
	}
};

uint64_t written(const GpuImageIndex &idx)
{
	uint64_t n = 0;
	for (const GpuDataFile &f : idx.files)
		n += f.parent_depth ? 0 : f.data_bytes;
	return n;
}

TEST(GpuIncremental, UnchangedChunksAreReferencedAndEveryByteComesBack)
{
	Chain c;
	GpuImageIndex first = c.dump(0);
	EXPECT_EQ(first.parent_bytes(), 0u);
	EXPECT_EQ(written(first), 5 * kChunk);
	fill(c.host, 10, 0x100000 + 2 * kChunk, kPage, 9); // one page of pid 10's third chunk changes
	GpuImageIndex second = c.dump(1);
	EXPECT_EQ(second.parent_bytes(), 4 * kChunk);
	EXPECT_EQ(written(second), kChunk);
	size_t parent_files = 0;
	for (const GpuDataFile &f : second.files)
		if (f.parent_depth) {
			parent_files++;
			EXPECT_EQ(f.parent_depth, 1u);
			EXPECT_EQ(f.id, first.id);
			EXPECT_EQ(f.path(), "parent/" + f.name);
		}
	EXPECT_GE(parent_files, 1u);
	auto back = read_gpu_index(c.dirs[1]);
	ASSERT_TRUE(back.ok() && back->has_value());
	EXPECT_EQ((*back)->files, second.files);
	ASSERT_TRUE(check_gpu_files(c.dirs[1], **back).ok());

	// Written into fresh processes: every byte as at the second dump.
	FakeHost restored;
	ASSERT_TRUE(load_gpu_state(restored, c.dirs[1], **back, {{20, 1}, {21, 2}}, 2).ok());
	EXPECT_EQ(bytes_of(restored, 20, 0x100000, 4 * kChunk), bytes_of(c.host, 10, 0x100000, 4 * kChunk));
	EXPECT_EQ(bytes_of(restored, 21, 0x300000, kChunk), bytes_of(c.host, 11, 0x300000, kChunk));

	// Mapped by CRIU: only this dump's own chunk is mapped; the parent's are written by the plugin.
	std::vector<std::string> names;
	auto mapped = request_mapped_gpu_image(**back, true, [&](int, uint64_t, uint64_t, const char *n, uint64_t) {
		names.emplace_back(n);
		return 0;
	}, MapFd());
	EXPECT_EQ(names.size(), 1u);
	for (const std::string &n : names)
		EXPECT_EQ(n.find('/'), std::string::npos) << n;
	FakeHost mapped_host;
	ASSERT_TRUE(load_gpu_state(mapped_host, c.dirs[1], **back, {{20, 1, false}, {21, 2, false}}, 2).ok());
	EXPECT_EQ(bytes_of(mapped_host, 20, 0x100000, 2 * kChunk), bytes_of(c.host, 10, 0x100000, 2 * kChunk));
	EXPECT_EQ(mapped_host.memory[20].count(0x100000 + 2 * kChunk), 0u); // the changed chunk: CRIU's to map
	EXPECT_EQ(bytes_of(mapped_host, 21, 0x300000, kChunk), bytes_of(c.host, 11, 0x300000, kChunk));
}

TEST(GpuIncremental, AChainReferencesTheImageThatHoldsTheBytes)
{
	Chain c;
	GpuImageIndex first = c.dump(0);
	fill(c.host, 11, 0x300000, kChunk, 5);
	GpuImageIndex second = c.dump(1);
	GpuImageIndex third = c.dump(2); // nothing changed since the second
	EXPECT_EQ(third.parent_bytes(), 5 * kChunk);
	EXPECT_EQ(written(third), 0u);
	bool depth1 = false, depth2 = false;
	for (const GpuDataFile &f : third.files) {
		depth1 |= f.parent_depth == 1 && f.id == second.id;
		depth2 |= f.parent_depth == 2 && f.id == first.id;
	}
	EXPECT_TRUE(depth1 && depth2);
	FakeHost restored;
	ASSERT_TRUE(load_gpu_state(restored, c.dirs[2], third, {{20, 1}, {21, 2}}, 3).ok());
	EXPECT_EQ(bytes_of(restored, 20, 0x100000, 4 * kChunk), bytes_of(c.host, 10, 0x100000, 4 * kChunk));
	EXPECT_EQ(bytes_of(restored, 21, 0x300000, kChunk), bytes_of(c.host, 11, 0x300000, kChunk));
}

TEST(GpuIncremental, AMissingOrReplacedParentIsRefusedByName)
{
	Chain c;
	GpuImageIndex first = c.dump(0);
	GpuImageIndex second = c.dump(1);
	ASSERT_GT(second.parent_bytes(), 0u);
	ASSERT_TRUE(std::any_of(second.files.begin(), second.files.end(), [](const GpuDataFile &f) { return f.parent_depth > 0; }));

	// The parent replaced by another dump of the same shape: its files carry another id (written over the
	// id in each header; the writers' share of the chunks differs from dump to dump, so their sizes do too).
	for (const GpuDataFile &f : first.files) {
		int fd = openat(c.dirs[0], f.name.c_str(), O_WRONLY | O_CLOEXEC);
		ASSERT_GE(fd, 0);
		ASSERT_EQ(pwrite(fd, std::string(32, 'f').data(), 32, 8), 32);
		close(fd);
	}
	Status st = check_gpu_files(c.dirs[1], second);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("is not the parent image's file"), std::string::npos) << st.error().message();
	EXPECT_NE(st.error().message().find("parent/cuda-gpu-"), std::string::npos) << st.error().message();

	for (const GpuDataFile &f : first.files)
		ASSERT_EQ(unlinkat(c.dirs[0], f.name.c_str(), 0), 0);
	st = check_gpu_files(c.dirs[1], second);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("(a file of the parent image"), std::string::npos) << st.error().message();
	EXPECT_NE(st.error().message().find("parent/cuda-gpu-"), std::string::npos) << st.error().message();
	FakeHost restored;
	EXPECT_FALSE(load_gpu_state(restored, c.dirs[1], second, {{20, 1}, {21, 2}}, 2).ok());
}

TEST(GpuIncremental, AParentIndexIsReadOnlyThroughTheParentLink)
{
	Chain c;
	auto none = read_parent_gpu_image(c.dirs[0]); // no parent link
	ASSERT_TRUE(none.ok());
	EXPECT_FALSE(none->has_value());
	auto empty = read_parent_gpu_image(c.dirs[1]); // a parent without a GPU image (a pre-dump's)
	ASSERT_TRUE(empty.ok());
	EXPECT_FALSE(empty->has_value());
	c.dump(0);
	auto some = read_parent_gpu_image(c.dirs[1]);
	ASSERT_TRUE(some.ok());
	EXPECT_TRUE(some->has_value());
}

TEST(GpuIncremental, IndexesWithMalformedParentFilesAreRefused)
{
	GpuImageIndex idx;
	idx.id = new_gpu_image_id();
	idx.files = {{"cuda-gpu-0.img", 1 << 20, 0, 1, ""}}; // a parent's file without its id
	auto enc = encode_gpu_index(idx);
	EXPECT_FALSE(decode_gpu_index(enc.data(), enc.size()).ok());
	idx.files = {{"cuda-gpu-0.img", 1 << 20, 0, kGpuMaxParentDepth + 1, new_gpu_image_id()}};
	enc = encode_gpu_index(idx);
	EXPECT_FALSE(decode_gpu_index(enc.data(), enc.size()).ok());
	idx.files = {{"cuda-gpu-0.img", 1 << 20, 0, 2, new_gpu_image_id()}};
	enc = encode_gpu_index(idx);
	auto ok = decode_gpu_index(enc.data(), enc.size());
	ASSERT_TRUE(ok.ok()) << ok.error().message();
	EXPECT_EQ(ok->files, idx.files);
}

// Compressed and raw images reference each other's chunks: a raw dump of a compressed parent, and a
// compressed dump of that, keep the parent's encoding for what they reference; every byte comes back.
TEST(GpuIncremental, CompressedAndRawImagesReferenceEachOther)
{
	Chain c;
	c.zstd_level = 1;
	GpuImageIndex first = c.dump(0);
	ASSERT_TRUE(std::all_of(first.processes[0].chunks.begin(), first.processes[0].chunks.end(),
				[](const GpuChunk &ch) { return ch.compressed(); }));
	fill(c.host, 10, 0x100000 + kChunk, kPage, 7);
	c.zstd_level = 0;
	GpuImageIndex second = c.dump(1);
	EXPECT_EQ(second.parent_bytes(), 4 * kChunk) << "the 4 unchanged chunks are the parent's, compressed";
	size_t referenced_compressed = 0;
	for (const GpuProcessChunks &p : second.processes)
		for (const GpuChunk &ch : p.chunks)
			referenced_compressed += second.files[ch.file].parent_depth && ch.compressed();
	EXPECT_EQ(referenced_compressed, 4u);
	fill(c.host, 11, 0x300000, kPage, 8);
	c.zstd_level = 1;
	GpuImageIndex third = c.dump(2);
	EXPECT_EQ(third.parent_bytes(), 4 * kChunk) << "3 chunks two images up, 1 raw one image up";
	auto back = read_gpu_index(c.dirs[2]);
	ASSERT_TRUE(back.ok() && back->has_value());
	FakeHost restored;
	ASSERT_TRUE(load_gpu_state(restored, c.dirs[2], **back, {{20, 1}, {21, 2}}, 2).ok());
	EXPECT_EQ(bytes_of(restored, 20, 0x100000, 4 * kChunk), bytes_of(c.host, 10, 0x100000, 4 * kChunk));
	EXPECT_EQ(bytes_of(restored, 21, 0x300000, kChunk), bytes_of(c.host, 11, 0x300000, kChunk));
}

} // namespace
} // namespace cuda_criu::testing
