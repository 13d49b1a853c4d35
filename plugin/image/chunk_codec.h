// How a stored chunk of the GPU image is encoded (compress=zstd; docs/gpu-image.md, "Compression"): zstd,
// either on the bytes as they are or byte-shuffled first (the even bytes, then the odd ones: bf16 and fp16
// weights put their sign-and-exponent bytes together, which zstd then finds). A chunk that does not
// shrink is stored raw. The checksum stays that of the chunk's own bytes, checked after decoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/result.h"

namespace cuda_criu {

enum class ChunkEncoding : uint32_t {
	Raw = 0,
	Zstd = 1,
	ZstdShuffled = 2,
};
inline constexpr uint32_t kChunkEncodings = 3;

const char *chunk_encoding_name(ChunkEncoding e);

// zstd's level for the GPU image: 1 (compress=zstd) or what compress=zstd:LEVEL says; 0: off.
inline constexpr int kDefaultZstdLevel = 1;
inline constexpr int kMaxZstdLevel = 19;

// One thread's encoder and decoder state (zstd contexts and scratch), reused chunk after chunk.
class ChunkCodec {
public:
	ChunkCodec();
	~ChunkCodec();
	ChunkCodec(const ChunkCodec &) = delete;
	ChunkCodec &operator=(const ChunkCodec &) = delete;

	// Encodes len bytes at level: shuffled; as they are where that does not shrink them; raw where neither
	// saves a page at least. The stored bytes are out()'s first stored_len, or src for raw.
	struct Encoded {
		ChunkEncoding encoding = ChunkEncoding::Raw;
		size_t stored_len = 0;
	};
	Encoded encode(const uint8_t *src, size_t len, int level);
	const uint8_t *out() const { return out_.data(); }

	// Decodes stored_len bytes into exactly len bytes at dst; an error says what is wrong with them (a
	// frame that does not decode, or to another size than len: never more than len bytes are written).
	Status decode(ChunkEncoding encoding, const uint8_t *stored, size_t stored_len, uint8_t *dst, size_t len);

private:
	void *cctx_ = nullptr;
	void *dctx_ = nullptr;
	int level_ = 0; // the level cctx_ is set up for (0: none yet)
	std::vector<uint8_t> shuffled_, out_, plain_;
};

} // namespace cuda_criu
