#include "image/chunk_codec.h"

#include <zstd.h>

#include <cstring>

namespace cuda_criu {
namespace {

constexpr size_t kPage = 4096;

void shuffle(const uint8_t *src, size_t len, uint8_t *dst)
{
	size_t half = len / 2;
	for (size_t i = 0; i < half; i++) {
		dst[i] = src[2 * i];
		dst[half + i] = src[2 * i + 1];
	}
	if (len % 2)
		dst[len - 1] = src[len - 1];
}

void unshuffle(const uint8_t *src, size_t len, uint8_t *dst)
{
	size_t half = len / 2;
	for (size_t i = 0; i < half; i++) {
		dst[2 * i] = src[i];
		dst[2 * i + 1] = src[half + i];
	}
	if (len % 2)
		dst[len - 1] = src[len - 1];
}

} // namespace

const char *chunk_encoding_name(ChunkEncoding e)
{
	switch (e) {
	case ChunkEncoding::Raw:
		return "raw";
	case ChunkEncoding::Zstd:
		return "zstd";
	case ChunkEncoding::ZstdShuffled:
		return "zstd, byte-shuffled";
	}
	return "unknown";
}

ChunkCodec::ChunkCodec() : cctx_(ZSTD_createCCtx()), dctx_(ZSTD_createDCtx())
{
	if (!cctx_ || !dctx_)
		throw std::bad_alloc();
}

ChunkCodec::~ChunkCodec()
{
	ZSTD_freeCCtx(static_cast<ZSTD_CCtx *>(cctx_));
	ZSTD_freeDCtx(static_cast<ZSTD_DCtx *>(dctx_));
}

ChunkCodec::Encoded ChunkCodec::encode(const uint8_t *src, size_t len, int level)
{
	auto *cctx = static_cast<ZSTD_CCtx *>(cctx_);
	if (level != level_) {
		// Level 1 with a match table of 256 entries instead of zstd's 16384: byte-shuffled 16-bit weights
		// are mostly literals, which the smaller table hands to the entropy coder sooner. Measured on bf16
		// weights: twice the rate (0.6 -> 1.2 GB/s a thread) at the same ratio; what a frame's decoder
		// needs does not change. Higher levels keep zstd's own parameters.
		ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
		ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
		if (level == 1)
			ZSTD_CCtx_setParameter(cctx, ZSTD_c_hashLog, 8);
		level_ = level;
	}
	size_t bound = ZSTD_compressBound(len);
	out_.resize(bound);
	shuffled_.resize(len);
	shuffle(src, len, shuffled_.data());
	// Worth storing only when it saves a page: stored chunks start on page boundaries.
	size_t best = len > kPage ? len - kPage : 0;
	Encoded e;
	size_t n = ZSTD_compress2(cctx, out_.data(), bound, shuffled_.data(), len);
	if (!ZSTD_isError(n) && n <= best) {
		e = {ChunkEncoding::ZstdShuffled, n};
		best = n;
	}
	// Shuffling pays for 16-bit data, GPU state's bulk; a chunk it does not shrink is tried as it is (a
	// second pass only there, so that the dump's cost stays one pass for data that compresses).
	if (e.encoding == ChunkEncoding::Raw) {
		plain_.resize(bound);
		size_t m = ZSTD_compress2(cctx, plain_.data(), bound, src, len);
		if (!ZSTD_isError(m) && m < best) {
			e = {ChunkEncoding::Zstd, m};
			std::memcpy(out_.data(), plain_.data(), m);
		}
	}
	if (e.encoding == ChunkEncoding::Raw)
		e.stored_len = len;
	return e;
}

Status ChunkCodec::decode(ChunkEncoding encoding, const uint8_t *stored, size_t stored_len, uint8_t *dst, size_t len)
{
	if (encoding == ChunkEncoding::Raw) {
		if (stored_len != len)
			return make_error(EBADMSG, "a raw chunk of %zu bytes stored in %zu", len, stored_len);
		std::memcpy(dst, stored, len);
		return {};
	}
	if (encoding != ChunkEncoding::Zstd && encoding != ChunkEncoding::ZstdShuffled)
		return make_error(EBADMSG, "unknown encoding %u", static_cast<unsigned>(encoding));
	// The frame says its size: a frame that claims more than the chunk (a decompression bomb) is refused
	// before it is decoded, and the decoder is never given room for more than len bytes.
	unsigned long long size = ZSTD_getFrameContentSize(stored, stored_len);
	if (size == ZSTD_CONTENTSIZE_ERROR)
		return make_error(EBADMSG, "%s", "not a zstd frame");
	if (size != ZSTD_CONTENTSIZE_UNKNOWN && size != len)
		return make_error(EBADMSG, "a zstd frame of %llu bytes where the chunk has %zu", size, len);
	uint8_t *to = dst;
	if (encoding == ChunkEncoding::ZstdShuffled) {
		shuffled_.resize(len);
		to = shuffled_.data();
	}
	size_t n = ZSTD_decompressDCtx(static_cast<ZSTD_DCtx *>(dctx_), to, len, stored, stored_len);
	if (ZSTD_isError(n))
		return make_error(EBADMSG, "zstd: %s", ZSTD_getErrorName(n));
	if (n != len)
		return make_error(EBADMSG, "decodes to %zu bytes where the chunk has %zu", n, len);
	if (encoding == ChunkEncoding::ZstdShuffled)
		unshuffle(to, len, dst);
	return {};
}

} // namespace cuda_criu
