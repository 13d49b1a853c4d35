// The GPU image's compressed chunks (compress=zstd): the chunk codec, the index that records each chunk's
// encoding and stored length (format version 3), and a store and restore through them, damaged ones too.
#include <gtest/gtest.h>

#include <algorithm>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/gpu_store.h"
#include "core/mapped_restore.h"
#include "fakes.h"
#include "gpu_memory.h"
#include "image/chunk_codec.h"
#include "image/gpu_image.h"
#include "temp_dir.h"

namespace cuda_criu::testing {
namespace {

constexpr uint64_t kPage = 4096;
constexpr size_t kLen = 2 << 20;

// bf16-like weights: a few exponents, random mantissas (what shuffling is for).
std::vector<uint8_t> weights(size_t len, unsigned seed)
{
	std::mt19937 rng(seed);
	std::vector<uint8_t> b(len);
	for (size_t i = 0; i + 1 < len; i += 2) {
		b[i] = static_cast<uint8_t>(rng());               // mantissa and the exponent's low bit
		b[i + 1] = static_cast<uint8_t>(0x3c + rng() % 3); // sign and exponent: few values
	}
	return b;
}

std::vector<uint8_t> noise(size_t len, unsigned seed)
{
	std::mt19937 rng(seed);
	std::vector<uint8_t> b(len);
	for (uint8_t &x : b)
		x = static_cast<uint8_t>(rng());
	return b;
}

TEST(ChunkCodec, WeightsAreShuffledNoiseStaysRawEachDecodesToItsBytes)
{
	ChunkCodec codec;
	std::vector<uint8_t> w = weights(kLen, 1), n = noise(kLen, 2), text(kLen);
	for (size_t i = 0; i < kLen; i++)
		text[i] = static_cast<uint8_t>("the GPU image, compressed "[i % 26]);
	struct Case {
		const std::vector<uint8_t> &bytes;
		ChunkEncoding expect;
	};
	for (const Case &c : {Case{w, ChunkEncoding::ZstdShuffled}, Case{n, ChunkEncoding::Raw}, Case{text, ChunkEncoding::ZstdShuffled}}) {
		ChunkCodec::Encoded e = codec.encode(c.bytes.data(), kLen, 1);
		EXPECT_EQ(e.encoding, c.expect);
		if (e.encoding == ChunkEncoding::Raw) {
			EXPECT_EQ(e.stored_len, kLen);
			continue;
		}
		EXPECT_LE(e.stored_len, kLen - kPage);
		std::vector<uint8_t> stored(codec.out(), codec.out() + e.stored_len), back(kLen);
		ASSERT_TRUE(codec.decode(e.encoding, stored.data(), stored.size(), back.data(), kLen).ok());
		EXPECT_EQ(back, c.bytes);
	}
	// Data whose even and odd bytes are unrelated but which repeats as it is: plain zstd where shuffling
	// does not shrink it.
	std::vector<uint8_t> repeated(kLen);
	std::vector<uint8_t> block = noise(3 * kPage + 1, 3);
	for (size_t i = 0; i < kLen; i++)
		repeated[i] = block[i % block.size()];
	ChunkCodec::Encoded e = codec.encode(repeated.data(), kLen, 1);
	EXPECT_NE(e.encoding, ChunkEncoding::Raw);
	std::vector<uint8_t> back(kLen);
	ASSERT_TRUE(codec.decode(e.encoding, codec.out(), e.stored_len, back.data(), kLen).ok());
	EXPECT_EQ(back, repeated);
}

// The byte shuffle takes 16 pairs at a time and the rest one by one: lengths that end anywhere in a block,
// odd ones included, come back byte for byte.
TEST(ChunkCodec, EveryLengthComesBackThroughTheShuffle)
{
	ChunkCodec codec;
	std::vector<uint8_t> w = weights(kLen, 4);
	for (size_t len : {kLen, kLen - 1, kLen - 17, kLen - 31, kLen - 32, kLen - 33, 16 * kPage + 1, 16 * kPage + 30}) {
		ChunkCodec::Encoded e = codec.encode(w.data(), len, 1);
		ASSERT_EQ(e.encoding, ChunkEncoding::ZstdShuffled) << len;
		std::vector<uint8_t> back(len, 0xee);
		ASSERT_TRUE(codec.decode(e.encoding, codec.out(), e.stored_len, back.data(), len).ok()) << len;
		EXPECT_TRUE(std::equal(back.begin(), back.end(), w.begin())) << len;
	}
}

TEST(ChunkCodec, DamagedTruncatedLyingAndOversizedFramesAreRefused)
{
	ChunkCodec codec;
	std::vector<uint8_t> w = weights(kLen, 4);
	ChunkCodec::Encoded e = codec.encode(w.data(), kLen, 1);
	ASSERT_EQ(e.encoding, ChunkEncoding::ZstdShuffled);
	std::vector<uint8_t> stored(codec.out(), codec.out() + e.stored_len);
	std::vector<uint8_t> back(kLen + kPage, 0xee);
	// Truncated.
	EXPECT_FALSE(codec.decode(e.encoding, stored.data(), stored.size() / 2, back.data(), kLen).ok());
	// A stored length that lies (longer: garbage after the frame).
	std::vector<uint8_t> longer = stored;
	longer.resize(stored.size() + 100, 0x55);
	EXPECT_FALSE(codec.decode(e.encoding, longer.data(), longer.size(), back.data(), kLen).ok());
	// An encoding that lies.
	EXPECT_FALSE(codec.decode(ChunkEncoding::Raw, stored.data(), stored.size(), back.data(), kLen).ok());
	EXPECT_FALSE(codec.decode(static_cast<ChunkEncoding>(7), stored.data(), stored.size(), back.data(), kLen).ok());
	// A flipped byte in the frame's data (its checksum-less payload decodes to other bytes, or fails): never
	// the chunk's own bytes, and the decoder writes nothing past len.
	std::vector<uint8_t> flipped = stored;
	flipped[flipped.size() / 2] ^= 0x40;
	Status st = codec.decode(e.encoding, flipped.data(), flipped.size(), back.data(), kLen);
	EXPECT_TRUE(!st.ok() || std::memcmp(back.data(), w.data(), kLen) != 0);
	EXPECT_EQ(back[kLen], 0xee);
	// A frame that decodes to more than the chunk (a decompression bomb): refused, nothing past len.
	std::vector<uint8_t> big = weights(2 * kLen, 5);
	ChunkCodec::Encoded b = codec.encode(big.data(), big.size(), 1);
	ASSERT_NE(b.encoding, ChunkEncoding::Raw);
	std::vector<uint8_t> bomb(codec.out(), codec.out() + b.stored_len);
	st = codec.decode(b.encoding, bomb.data(), bomb.size(), back.data(), kLen);
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("where the chunk has"), std::string::npos) << st.error().message();
	EXPECT_EQ(back[kLen], 0xee);
}

// Process 10: 3 chunks of weights, a chunk of noise, an all-zero chunk.
struct Weights {
	static constexpr uint32_t kChunk = 64 * kPage;
	FakeHost host;
	std::vector<GpuSaveTarget> targets{{10, 1, {{0x1000000, 0x1000000 + 5 * kChunk}}}};
	Weights()
	{
		for (int i = 0; i < 3; i++) {
			std::vector<uint8_t> w = weights(kChunk, 10 + i);
			EXPECT_TRUE(host.write_memory(10, 0x1000000 + i * kChunk, w.data(), kChunk).ok());
		}
		std::vector<uint8_t> n = noise(kChunk, 20);
		EXPECT_TRUE(host.write_memory(10, 0x1000000 + 3 * kChunk, n.data(), kChunk).ok());
	}
	Result<GpuImageIndex> save(TempDir &dir, int level)
	{
		return save_gpu_state(host, dir.fd(), targets, new_gpu_image_id(), 2, kChunk, nullptr, level);
	}
};

TEST(GpuStoreCompressed, ChunksAreCompressedOrRawAndEveryByteComesBackThroughVersion3)
{
	TempDir dir;
	Weights s;
	auto idx = s.save(dir, 1);
	ASSERT_TRUE(idx.ok()) << idx.error().message();
	const std::vector<GpuChunk> &ch = idx->processes[0].chunks;
	ASSERT_EQ(ch.size(), 4u) << "the zero chunk is left out";
	for (int i = 0; i < 3; i++) {
		EXPECT_EQ(ch[i].encoding, ChunkEncoding::ZstdShuffled);
		EXPECT_LT(ch[i].stored_len, ch[i].len);
		EXPECT_EQ(ch[i].offset % kPage, 0u);
	}
	EXPECT_EQ(ch[3].encoding, ChunkEncoding::Raw);
	EXPECT_EQ(ch[3].stored(), Weights::kChunk);
	EXPECT_EQ(idx->processes[0].zero_bytes, Weights::kChunk);
	ASSERT_TRUE(write_gpu_index(dir.fd(), *idx).ok());
	auto back = read_gpu_index(dir.fd());
	ASSERT_TRUE(back.ok() && back->has_value()) << (back.ok() ? "missing" : back.error().message());
	EXPECT_EQ((*back)->processes[0].chunks, ch);
	FakeHost restored;
	ASSERT_TRUE(load_gpu_state(restored, dir.fd(), **back, {{20, 1, false}}, 2).ok());
	EXPECT_EQ(bytes_of(restored, 20, 0x1000000, 3 * Weights::kChunk), bytes_of(s.host, 10, 0x1000000, 3 * Weights::kChunk))
		<< "compressed chunks are written into the process even where CRIU maps the image";
	EXPECT_EQ(restored.memory[20].count(0x1000000 + 3 * Weights::kChunk), 0u) << "the raw chunk is CRIU's to map";
	FakeHost written;
	ASSERT_TRUE(load_gpu_state(written, dir.fd(), **back, {{20, 1, true}}, 2).ok());
	EXPECT_EQ(bytes_of(written, 20, 0x1000000, 4 * Weights::kChunk), bytes_of(s.host, 10, 0x1000000, 4 * Weights::kChunk));
	// Without compression the same state is a version 1 index: older plugins read it as before.
	TempDir raw_dir;
	auto raw = s.save(raw_dir, 0);
	ASSERT_TRUE(raw.ok());
	for (const GpuChunk &c : raw->processes[0].chunks)
		EXPECT_FALSE(c.compressed());
	uint64_t raw_data = 0, packed_data = 0;
	for (const GpuDataFile &f : raw->files)
		raw_data += f.data_bytes;
	for (const GpuDataFile &f : idx->files)
		packed_data += f.data_bytes;
	EXPECT_LT(packed_data, raw_data * 3 / 4);
}

// On a CRIU that maps a plugin's memory (criu-patches/0008): the compressed chunks are decoded into a
// memory file of the process's own, which CRIU maps as one run; the raw chunk is mapped from its data file.
TEST(GpuStoreCompressed, CompressedChunksAreDecodedIntoMemoryCriuMaps)
{
	TempDir dir;
	Weights s;
	auto idx = s.save(dir, 1);
	ASSERT_TRUE(idx.ok());
	constexpr uint64_t kBase = 0x1000000, kChunk = Weights::kChunk;
	const GpuChunk &raw = idx->processes[0].chunks[3];
	ASSERT_FALSE(raw.compressed());
	using FileCalls = std::vector<std::tuple<int, uint64_t, uint64_t, std::string, uint64_t>>;
	using FdCalls = std::vector<std::tuple<int, uint64_t, uint64_t, uint64_t>>;
	FileCalls files;
	FdCalls fds;
	int fd_given = -1;
	auto map_file = [&](int pid, uint64_t a, uint64_t b, const char *n, uint64_t o) {
		files.emplace_back(pid, a, b, n, o);
		return 0;
	};
	auto mapped = request_mapped_gpu_image(*idx, true, map_file, [&](int pid, uint64_t a, uint64_t b, int fd, uint64_t o) {
		fds.emplace_back(pid, a, b, o);
		fd_given = fd;
		return 0;
	});
	EXPECT_EQ(files, (FileCalls{{1, kBase + 3 * kChunk, kBase + 4 * kChunk, idx->files[raw.file].name, raw.offset}}));
	EXPECT_EQ(fds, (FdCalls{{1, kBase, kBase + 3 * kChunk, 0}}));
	EXPECT_EQ(mapped.processes, (std::set<int>{1}));
	ASSERT_EQ(mapped.decoded.count(1), 1u);
	MemFile &memory = *mapped.decoded[1];
	EXPECT_EQ(memory.fd(), fd_given);
	EXPECT_EQ(memory.bytes(), 3 * kChunk);

	// Decoded (and checked) with no process yet, as from POST_FORKING: nothing is written anywhere else.
	ASSERT_TRUE(memory.map().ok());
	FakeHost none;
	ASSERT_TRUE(load_gpu_state(none, dir.fd(), *idx, {{0, 1, false, memory.data()}}, 2).ok());
	EXPECT_TRUE(none.memory.empty());
	memory.unmap();
	std::vector<uint8_t> back(3 * kChunk);
	ASSERT_EQ(pread(memory.fd(), back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
	EXPECT_EQ(back, bytes_of(s.host, 10, kBase, 3 * kChunk));
	memory.free_memory();
	struct stat st{};
	ASSERT_EQ(fstat(memory.fd(), &st), 0);
	EXPECT_EQ(st.st_size, 0) << "its memory is given back";

	// A CRIU that refuses the memory, or cannot map it: nothing decoded; without the call, the raw chunk
	// is still mapped and the plugin writes the compressed ones.
	auto refused = request_mapped_gpu_image(*idx, true, map_file, [](int, uint64_t, uint64_t, int, uint64_t) { return -EINVAL; });
	EXPECT_TRUE(refused.processes.empty());
	EXPECT_TRUE(refused.decoded.empty());
	auto without = request_mapped_gpu_image(*idx, true, map_file, MapFd());
	EXPECT_EQ(without.processes, (std::set<int>{1}));
	EXPECT_TRUE(without.decoded.empty());
}

TEST(GpuStoreCompressed, ADamagedCompressedChunkIsRefusedByFileAndOffset)
{
	TempDir dir;
	Weights s;
	auto idx = s.save(dir, 1);
	ASSERT_TRUE(idx.ok());
	const GpuChunk &c = idx->processes[0].chunks[1];
	ASSERT_TRUE(c.compressed());
	int fd = open(dir.file(idx->files[c.file].name).c_str(), O_RDWR);
	ASSERT_GE(fd, 0);
	uint8_t b = 0;
	off_t at = static_cast<off_t>(c.offset + c.stored_len / 2);
	ASSERT_EQ(pread(fd, &b, 1, at), 1);
	b ^= 0x40;
	ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
	close(fd);
	FakeHost restored;
	Status st = load_gpu_state(restored, dir.fd(), *idx, {{20, 1}}, 2);
	ASSERT_FALSE(st.ok());
	EXPECT_EQ(st.error().errno_value(), EBADMSG);
	const std::string &m = st.error().message();
	EXPECT_NE(m.find("restore pid 20 (pid 1 in the image)"), std::string::npos) << m;
	EXPECT_NE(m.find(format("GPU state at %#llx (%u bytes", static_cast<unsigned long long>(c.addr), c.len)), std::string::npos) << m;
	EXPECT_NE(m.find(format("in %s at offset %llu", idx->files[c.file].name.c_str(), static_cast<unsigned long long>(c.offset))),
		  std::string::npos)
		<< m;
}

// Where compressed chunks are decoded: one after another, each at an offset congruent to its address modulo
// 2 MiB (so that the memory's huge pages map whole into the process), raw chunks taking no room.
TEST(GpuIndexCompressed, DecodedChunksLieCongruentToTheirAddressesModulo2MiB)
{
	constexpr uint64_t kHuge = 2 << 20;
	GpuProcessChunks p;
	auto chunk = [](uint64_t addr, uint32_t len, bool compressed) {
		GpuChunk c{addr, len, 0, 0, 0};
		if (compressed) {
			c.encoding = ChunkEncoding::ZstdShuffled;
			c.stored_len = len / 2;
		}
		return c;
	};
	p.chunks = {chunk(0x7f0000201000, 0x1ff000, true), chunk(0x7f0000400000, kHuge, true),
		    chunk(0x7f0000600000, kHuge, false), chunk(0x7f0000a03000, 0x5000, true),
		    chunk(0x7f0000a08000, kHuge, true)};
	std::vector<uint64_t> at = p.decoded_offsets();
	ASSERT_EQ(at.size(), p.chunks.size() + 1);
	uint64_t end = 0;
	for (size_t i = 0; i < p.chunks.size(); i++) {
		if (!p.chunks[i].compressed())
			continue;
		EXPECT_EQ(at[i] % kHuge, p.chunks[i].addr % kHuge) << i;
		EXPECT_GE(at[i], end) << i << ": overlaps the chunk before";
		EXPECT_LT(at[i] - end, kHuge) << i << ": a gap of a huge page or more";
		end = at[i] + p.chunks[i].len;
	}
	EXPECT_EQ(at[1], at[0] + 0x1ff000) << "consecutive chunks stay one run";
	EXPECT_EQ(at[4], at[3] + 0x5000) << "consecutive chunks stay one run";
	EXPECT_EQ(p.decoded_bytes(), end);
}

TEST(GpuIndexCompressed, LyingEncodingsAndLengthsAreRefused)
{
	TempDir dir;
	Weights s;
	auto good = s.save(dir, 1);
	ASSERT_TRUE(good.ok());
	auto refused = [&](auto edit, const char *what) {
		GpuImageIndex idx = *good;
		edit(idx.processes[0].chunks[0]);
		auto bytes = encode_gpu_index(idx);
		auto r = decode_gpu_index(bytes.data(), bytes.size());
		ASSERT_FALSE(r.ok()) << what;
		EXPECT_NE(r.error().message().find("corrupt GPU image index"), std::string::npos) << r.error().message();
	};
	refused([](GpuChunk &c) { c.stored_len = c.len; }, "a compressed chunk as long as its bytes");
	refused([](GpuChunk &c) { c.stored_len = c.len + kPage; }, "a compressed chunk longer than its bytes");
	refused([](GpuChunk &c) { c.encoding = static_cast<ChunkEncoding>(5); }, "an unknown encoding");
	refused([](GpuChunk &c) { c.encoding = ChunkEncoding::Raw; }, "a raw chunk with a stored length");
	refused([](GpuChunk &c) { c.len = 2 * Weights::kChunk; }, "a chunk larger than the chunk size");
	refused([](GpuChunk &c) { c.offset = 1ULL << 40; }, "a chunk past its file's end");
}

} // namespace
} // namespace cuda_criu::testing
