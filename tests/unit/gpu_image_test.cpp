// The plugin's GPU image: its checksum, its index file, the parallel sparse store and its check on
// restore (core/gpu_store.h), and how the dump and restore sessions use them.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "base/crc32c.h"
#include "core/dump_session.h"
#include "core/gpu_store.h"
#include "core/mapped_restore.h"
#include "core/restore_session.h"
#include "fakes.h"
#include "gpu_memory.h"
#include "temp_dir.h"
#include "image/gpu_image.h"

namespace cuda_criu::testing {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint32_t kChunk = 2 * kPage; // small chunks keep the fake memory small

void flip_byte(const std::string &path, off_t at)
{
	int fd = open(path.c_str(), O_RDWR);
	ASSERT_GE(fd, 0);
	uint8_t c = 0;
	ASSERT_EQ(pread(fd, &c, 1, at), 1);
	c ^= 0x40;
	ASSERT_EQ(pwrite(fd, &c, 1, at), 1);
	close(fd);
}

TEST(Crc32c, KnownValues)
{
	EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
	EXPECT_EQ(crc32c("", 0), 0u);
	// Continuing a checksum equals taking it at once, whatever the split (odd lengths use the byte path).
	std::string s(1000, 'x');
	for (size_t i = 0; i < s.size(); i++)
		s[i] = static_cast<char>(i * 31);
	uint32_t whole = crc32c(s.data(), s.size());
	EXPECT_EQ(crc32c(s.data() + 13, s.size() - 13, crc32c(s.data(), 13)), whole);
	s[500] ^= 1;
	EXPECT_NE(crc32c(s.data(), s.size()), whole);
}

// Process 10: range A of 3 chunks (data, all zero, data with a zero page), range B of 1 chunk; process 11:
// 2 chunks of data.
struct Scenario {
	FakeHost host;
	std::vector<GpuSaveTarget> targets;
	Scenario()
	{
		targets.push_back({10, 1, {{0x100000, 0x100000 + 3 * kChunk}, {0x200000, 0x200000 + kChunk}}});
		targets.push_back({11, 2, {{0x300000, 0x300000 + 2 * kChunk}}});
		fill(host, 10, 0x100000, kChunk, 1);
		fill(host, 10, 0x100000 + 2 * kChunk, kPage, 2); // its second page stays zero
		fill(host, 10, 0x200000, kChunk, 3);
		fill(host, 11, 0x300000, 2 * kChunk, 4);
	}
};

TEST(GpuStore, StoresOnlyChunksWithDataAndRestoresEveryByte)
{
	TempDir dir;
	Scenario s;
	auto idx = save_gpu_state(s.host, dir.fd(), s.targets, new_gpu_image_id(), 3, kChunk);
	ASSERT_TRUE(idx.ok()) << idx.error().message();
	ASSERT_EQ(idx->processes.size(), 2u);
	const GpuProcessChunks &p10 = idx->processes[0];
	EXPECT_EQ(p10.ns_pid, 1);
	ASSERT_EQ(p10.chunks.size(), 3u); // the all-zero chunk is not stored
	EXPECT_EQ(p10.chunks[0].addr, 0x100000u);
	EXPECT_EQ(p10.chunks[1].addr, 0x100000u + 2 * kChunk);
	EXPECT_EQ(p10.chunks[2].addr, 0x200000u);
	EXPECT_EQ(p10.zero_bytes, kChunk);
	EXPECT_EQ(idx->processes[1].chunks.size(), 2u);
	EXPECT_EQ(idx->files.size(), 3u);
	uint64_t written = 0;
	for (const GpuDataFile &f : idx->files) {
		written += f.data_bytes;
		struct stat st {};
		ASSERT_EQ(stat(dir.file(f.name).c_str(), &st), 0);
		EXPECT_EQ(static_cast<uint64_t>(st.st_size), f.size);
	}
	EXPECT_EQ(written, 5 * kChunk - kPage); // the zero page inside a stored chunk is a hole
	ASSERT_TRUE(write_gpu_index(dir.fd(), *idx).ok());

	auto back = read_gpu_index(dir.fd());
	ASSERT_TRUE(back.ok() && back->has_value()) << (back.ok() ? "missing" : back.error().message());
	EXPECT_EQ((*back)->processes[0].chunks, p10.chunks);
	EXPECT_EQ((*back)->id, idx->id);

	// Restored as pids 20 and 21: every byte back, zero chunks untouched.
	FakeHost restored;
	ASSERT_TRUE(load_gpu_state(restored, dir.fd(), **back, {{20, 1}, {21, 2}}, 2).ok());
	EXPECT_EQ(bytes_of(restored, 20, 0x100000, 3 * kChunk), bytes_of(s.host, 10, 0x100000, 3 * kChunk));
	EXPECT_EQ(bytes_of(restored, 20, 0x200000, kChunk), bytes_of(s.host, 10, 0x200000, kChunk));
	EXPECT_EQ(bytes_of(restored, 21, 0x300000, 2 * kChunk), bytes_of(s.host, 11, 0x300000, 2 * kChunk));
	EXPECT_EQ(restored.memory[20].count(0x100000 + kChunk), 0u);
}

TEST(GpuStore, MappedProcessesAreCheckedNotWritten)
{
	TempDir dir;
	Scenario s;
	auto idx = save_gpu_state(s.host, dir.fd(), s.targets, new_gpu_image_id(), 2, kChunk);
	ASSERT_TRUE(idx.ok());
	FakeHost restored;
	ASSERT_TRUE(load_gpu_state(restored, dir.fd(), *idx, {{20, 1, false}, {21, 2, true}}, 2).ok());
	EXPECT_TRUE(restored.memory[20].empty());
	EXPECT_FALSE(restored.memory[21].empty());
}

TEST(GpuStore, AFlippedByteIsRefusedByFileAndOffset)
{
	TempDir dir;
	Scenario s;
	auto idx = save_gpu_state(s.host, dir.fd(), s.targets, new_gpu_image_id(), 1, kChunk);
	ASSERT_TRUE(idx.ok());
	const GpuChunk &c = idx->processes[1].chunks[1];
	flip_byte(dir.file(idx->files[c.file].name), static_cast<off_t>(c.offset + 100));
	FakeHost restored;
	Status st = load_gpu_state(restored, dir.fd(), *idx, {{20, 1}, {21, 2}}, 2);
	ASSERT_FALSE(st.ok());
	EXPECT_EQ(st.error().errno_value(), EBADMSG);
	const std::string &m = st.error().message();
	EXPECT_NE(m.find("restore pid 21 (pid 2 in the image)"), std::string::npos) << m;
	EXPECT_NE(m.find(format("GPU state at %#llx (%u bytes) in cuda-gpu-0.img at offset %llu fails its checksum",
				static_cast<unsigned long long>(c.addr), c.len, static_cast<unsigned long long>(c.offset))),
		  std::string::npos)
		<< m;
}

TEST(GpuStore, ShortMissingAndForeignFilesAreRefusedBeforeAnyChunk)
{
	TempDir dir;
	Scenario s;
	auto idx = save_gpu_state(s.host, dir.fd(), s.targets, new_gpu_image_id(), 2, kChunk);
	ASSERT_TRUE(idx.ok());
	ASSERT_TRUE(check_gpu_files(dir.fd(), *idx).ok());

	GpuImageIndex other = *idx;
	other.id = new_gpu_image_id();
	Status st = check_gpu_files(dir.fd(), other);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("cuda-gpu-0.img belongs to another dump"), std::string::npos);

	ASSERT_EQ(truncate(dir.file("cuda-gpu-1.img").c_str(), static_cast<off_t>(idx->files[1].size - kPage)), 0);
	st = check_gpu_files(dir.fd(), *idx);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("cuda-gpu-1.img is cut short"), std::string::npos) << st.error().message();
	FakeHost restored;
	EXPECT_FALSE(load_gpu_state(restored, dir.fd(), *idx, {{20, 1}}, 1).ok());
	EXPECT_TRUE(restored.memory[20].empty());

	ASSERT_EQ(unlink(dir.file("cuda-gpu-1.img").c_str()), 0);
	st = check_gpu_files(dir.fd(), *idx);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("open cuda-gpu-1.img"), std::string::npos);
}

TEST(GpuStore, AReadFailureFailsTheSaveAndRemovesItsFiles)
{
	TempDir dir;
	Scenario s;
	s.host.memory_fails.insert(11);
	auto idx = save_gpu_state(s.host, dir.fd(), s.targets, new_gpu_image_id(), 2, kChunk);
	ASSERT_FALSE(idx.ok());
	EXPECT_NE(idx.error().message().find("save the GPU state of pid 11"), std::string::npos) << idx.error().message();
	EXPECT_FALSE(dir.exists("cuda-gpu-0.img"));
	EXPECT_FALSE(dir.exists("cuda-gpu-1.img"));
}

TEST(GpuStore, ChecksumsOfTheStateCriuHoldsAreCheckedOverTheRestoredMemory)
{
	TempDir dir;
	Scenario s;
	auto idx = checksum_gpu_state(s.host, s.targets, new_gpu_image_id(), 2, kChunk);
	ASSERT_TRUE(idx.ok()) << idx.error().message();
	EXPECT_TRUE(idx->criu_pages);
	EXPECT_TRUE(idx->files.empty());
	EXPECT_FALSE(dir.exists("cuda-gpu-0.img"));
	ASSERT_EQ(idx->processes[0].chunks.size(), 4u); // every chunk, the all-zero one too
	EXPECT_EQ(idx->processes[0].zero_bytes, 0u);
	ASSERT_TRUE(write_gpu_index(dir.fd(), *idx).ok());
	auto back = read_gpu_index(dir.fd());
	ASSERT_TRUE(back.ok() && back->has_value());
	EXPECT_TRUE((*back)->criu_pages);

	// CRIU restored the memory as pids 20 and 21: intact, it passes; one byte off (a damaged pages file,
	// even inside the all-zero chunk), it fails naming the address.
	FakeHost restored;
	for (auto [from, to] : {std::pair{10, 20}, std::pair{11, 21}})
		restored.memory[to] = s.host.memory[from];
	ASSERT_TRUE(load_gpu_state(restored, dir.fd(), **back, {{20, 1}, {21, 2}}, 2).ok());
	EXPECT_EQ(restored.memory[20], s.host.memory[10]); // only read
	uint8_t one = 1;
	ASSERT_TRUE(restored.write_memory(20, 0x100000 + kChunk + 5, &one, 1).ok());
	Status st = load_gpu_state(restored, dir.fd(), **back, {{20, 1}, {21, 2}}, 2);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find(format("GPU state at %#llx (%u bytes), as CRIU restored it from its pages "
						   "images, fails its checksum",
						   static_cast<unsigned long long>(0x100000 + kChunk), kChunk)),
		  std::string::npos)
		<< st.error().message();
}

TEST(GpuIndex, MalformedIndexesAreRefused)
{
	TempDir dir;
	Scenario s;
	auto idx = save_gpu_state(s.host, dir.fd(), s.targets, new_gpu_image_id(), 2, kChunk);
	ASSERT_TRUE(idx.ok());
	auto refused = [](GpuImageIndex i, const char *what) {
		std::vector<uint8_t> b = encode_gpu_index(i);
		auto r = decode_gpu_index(b.data(), b.size());
		ASSERT_FALSE(r.ok()) << what;
		EXPECT_NE(r.error().message().find(what), std::string::npos) << r.error().message();
	};
	GpuImageIndex i = *idx;
	GpuDataFile &holder = i.files[i.processes[0].chunks[0].file]; // its chunks lie past its end
	holder.size = kGpuDataHeaderBytes;
	refused(i, ("lies past the end of " + holder.name).c_str());
	i = *idx;
	i.processes[0].chunks[0].file = 7;
	refused(i, "is malformed");
	i = *idx;
	i.files[0].name = "../etc/passwd";
	refused(i, "data file name");
	i = *idx;
	std::swap(i.processes[0].chunks[0], i.processes[0].chunks[1]); // out of order: overlapping
	refused(i, "is malformed");
	std::vector<uint8_t> b = encode_gpu_index(*idx);
	b[b.size() / 2] ^= 0xff;
	auto r = decode_gpu_index(b.data(), b.size() - 1);
	EXPECT_FALSE(r.ok());
}

// The dump session: who stores the GPU state, and what CRIU is asked to leave out.
struct DumpRig {
	FakeDriver driver;
	FakeHost host;
	TempDir dir;
	DumpRig()
	{
		driver.running_threads = &host.running_threads;
		driver.add(10);
		host.cuda_pids.insert(10);
		host.maps[10] = {{}, {{0x100000, 0x100000 + 4 * kPage, "rw-p", 0, "", {}}}};
		fill(host, 10, 0x100000, 4 * kPage, 9);
	}
	std::unique_ptr<DumpSession> session(Options o = Options())
	{
		auto s = std::make_unique<DumpSession>(o, host, [this]() -> Result<Driver *> { return static_cast<Driver *>(&driver); });
		EXPECT_TRUE(s->pause(10).ok());
		EXPECT_TRUE(s->checkpoint(10).ok());
		return s;
	}
};

using Skips = std::vector<std::tuple<pid_t, uint64_t, uint64_t>>;

TEST(GpuImageDump, ThePluginStoresTheStateAndCriuLeavesItOut)
{
	DumpRig rig;
	auto s = rig.session();
	Skips skips;
	ASSERT_TRUE(s->store_gpu_image(rig.dir.fd(), [&](pid_t p, uint64_t a, uint64_t b) {
			     skips.emplace_back(p, a, b);
			     return 0;
		     }).ok());
	EXPECT_EQ(skips, (Skips{{10, 0x100000, 0x100000 + 4 * kPage}}));
	ImageRecord r = s->image_record();
	EXPECT_FALSE(r.gpu_image_id.empty());
	auto idx = read_gpu_index(rig.dir.fd());
	ASSERT_TRUE(idx.ok() && idx->has_value());
	EXPECT_EQ((*idx)->id, r.gpu_image_id);
	EXPECT_EQ((*idx)->processes.at(0).stored_bytes(), 4 * kPage);
	EXPECT_NE(s->summary().find("written (0.0% zero pages) into 1 file(s)"),
		  std::string::npos)
		<< s->summary();
}

TEST(GpuImageDump, AFailedDumpRemovesItsGpuImage)
{
	DumpRig rig;
	auto s = rig.session();
	ASSERT_TRUE(s->store_gpu_image(rig.dir.fd(), [](pid_t, uint64_t, uint64_t) { return 0; }).ok());
	ASSERT_TRUE(rig.dir.exists("cuda-gpu-0.img"));
	(void)s->finish(true, false); // CRIU failed later: no inventory, the image never restores
	EXPECT_FALSE(rig.dir.exists("cuda-gpu-0.img"));
	EXPECT_FALSE(rig.dir.exists(kGpuIndexFileName));
	EXPECT_EQ(rig.driver.state_of(10), CudaState::Running); // and the process is back as it was
}

TEST(GpuImageDump, CriuKeepsTheStateWhenAskedOrWhenItCannotLeavePagesOut)
{
	for (int variant = 0; variant < 3; variant++) {
		DumpRig rig;
		Options o;
		if (variant == 0)
			o.gpu_image = GpuImage::Criu;
		auto s = rig.session(o);
		int calls = 0;
		SkipPages skip;
		if (variant != 1)
			skip = [&](pid_t, uint64_t, uint64_t) { return ++calls, -EOPNOTSUPP; };
		ASSERT_TRUE(s->store_gpu_image(rig.dir.fd(), skip).ok());
		ImageRecord r = s->image_record();
		EXPECT_TRUE(r.gpu_image_id.empty()) << variant;
		EXPECT_FALSE(r.gpu_checksums_id.empty()) << variant;
		auto idx = read_gpu_index(rig.dir.fd()); // checksums only
		ASSERT_TRUE(idx.ok() && idx->has_value()) << variant;
		EXPECT_TRUE((*idx)->criu_pages);
		EXPECT_EQ((*idx)->id, r.gpu_checksums_id);
		EXPECT_FALSE(rig.dir.exists("cuda-gpu-0.img")) << variant;
		EXPECT_EQ(calls, variant == 2 ? 1 : 0);
		EXPECT_NE(s->summary().find("GPU state in CRIU's pages images"), std::string::npos) << s->summary();
	}
}

TEST(GpuImageDump, ARefusalAfterCriuAgreedFailsTheDump)
{
	DumpRig rig;
	rig.host.maps[10] = {{},
			     {{0x100000, 0x101000, "rw-p", 0, "", {}}, {0x200000, 0x201000, "rw-p", 0, "", {}}}};
	auto s = rig.session();
	int calls = 0;
	Status st = s->store_gpu_image(rig.dir.fd(), [&](pid_t, uint64_t, uint64_t) { return ++calls == 1 ? 0 : -EINVAL; });
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("CRIU refused to leave the GPU state at 0x200000-0x201000"), std::string::npos)
		<< st.error().message();
}

TEST(GpuImageRestore, ADamagedImageIsRefusedBeforeAnyDriverCall)
{
	FakeDriver driver;
	FakeHost host;
	driver.running_threads = &host.running_threads;
	driver.add(30, CudaState::Checkpointed);
	host.cuda_pids.insert(30);
	host.stopped = {30};
	ImageRecord image;
	image.processes.push_back({30, 30, CudaState::Running, {}, 0, 0, 0, {}});
	image.gpu_image_id = "x";
	std::vector<GpuLoadTarget> seen;
	RestoreSession r(Options(), host, [&]() -> Result<Driver *> { return static_cast<Driver *>(&driver); }, image, true,
			 {},
			 GpuImageLoad{[&](const std::vector<GpuLoadTarget> &t) -> Status {
					      seen = t;
					      return make_error(EBADMSG, "%s", "GPU state at 0x1000 fails its checksum");
				      },
				      [](pid_t) { return true; }, {}, {}, {}, {}}); // chunks to write: checked before any driver call
	auto res = r.resume(30);
	ASSERT_FALSE(res.ok());
	EXPECT_NE(res.error().message().find("fails its checksum"), std::string::npos);
	ASSERT_EQ(seen.size(), 1u);
	EXPECT_EQ(seen[0].pid, 30);
	for (const std::string &c : driver.calls)
		EXPECT_EQ(c.rfind("restore", 0), std::string::npos) << c;
	EXPECT_EQ(driver.state_of(30), CudaState::Checkpointed);
}

TEST(GpuImageRestore, RunsOfChunksAreMappedFromThePluginsFiles)
{
	GpuImageIndex idx;
	idx.files = {{"cuda-gpu-0.img", 1 << 20, 0, 0, ""}, {"cuda-gpu-1.img", 1 << 20, 0, 0, ""}};
	// Process 1: two adjacent chunks in file 0 (one run), then one in file 1; process 2: one chunk.
	idx.processes.push_back({1, 10, {{0x10000, 0x2000, 0, 4096, 0}, {0x12000, 0x2000, 0, 4096 + 0x2000, 0},
					  {0x14000, 0x2000, 1, 4096, 0}}, 0});
	idx.processes.push_back({2, 11, {{0x20000, 0x1000, 1, 4096 + 0x2000, 0}}, 0});
	using Calls = std::vector<std::tuple<int, uint64_t, uint64_t, std::string, uint64_t>>;
	Calls calls;
	auto mapped = request_mapped_gpu_image(idx, true, [&](int pid, uint64_t a, uint64_t b, const char *n, uint64_t o) {
		calls.emplace_back(pid, a, b, n, o);
		return pid == 2 ? -EINVAL : 0;
	}, MapFd());
	EXPECT_EQ(calls, (Calls{{1, 0x10000, 0x14000, "cuda-gpu-0.img", 4096},
				{1, 0x14000, 0x16000, "cuda-gpu-1.img", 4096},
				{2, 0x20000, 0x21000, "cuda-gpu-1.img", 4096 + 0x2000}}));
	EXPECT_EQ(mapped.processes, (std::set<int>{1}));
	EXPECT_TRUE(request_mapped_gpu_image(idx, false, [&](int, uint64_t, uint64_t, const char *, uint64_t) { return 0; },
					     MapFd())
			    .processes.empty());
	EXPECT_TRUE(request_mapped_gpu_image(idx, true, MapFile(), MapFd()).processes.empty());
}

} // namespace
} // namespace cuda_criu::testing
