// libFuzzer target for the image parsers: decode_image() (cuda-plugin.img), decode_gpu_index()
// (cuda-gpu.img) must turn every input into either a record or a clear error, without crashing, leaking,
// hanging or allocating out of proportion to the input; so must the GPU image's chunk decoder
// (image/chunk_codec.h) every input as a stored chunk, never writing past the chunk it decodes into, and
// the readers of CRIU's files.img and mm-N.img (image/criu_pages.h) every input as their messages.
// Built with clang by run_fuzzer.sh; replay_main.cpp runs the same target over the corpus under g++.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "image/chunk_codec.h"
#include "image/criu_pages.h"
#include "image/gpu_image.h"
#include "image/image.h"

namespace {

// Did the parser refuse? Every refusal says something: an empty message would leave the user with nothing.
template <typename R> bool refused(const R &r)
{
	if (r)
		return false;
	if (r.error().message().empty() || r.error().errno_value() <= 0)
		std::abort();
	return true;
}

void check_one(const uint8_t *data, size_t size)
{
	auto r = cuda_criu::decode_image(data, size);
	if (refused(r))
		return;
	// What decodes must encode again and decode to the same record shape (no state lost or invented).
	auto bytes = cuda_criu::encode_image(*r);
	auto again = cuda_criu::decode_image(bytes.data(), bytes.size());
	if (!again || again->processes.size() != r->processes.size() || again->gpus.size() != r->gpus.size())
		std::abort();
	for (size_t i = 0; i < r->processes.size(); i++)
		if (again->processes[i].pid != r->processes[i].pid || r->processes[i].pid <= 0)
			std::abort();
	// Nothing past what one machine can hold is accepted (image.h's limits).
	if (r->processes.size() > cuda_criu::kImageMaxProcesses || r->gpus.size() > cuda_criu::kImageMaxGpus ||
	    r->other_gpus.size() > cuda_criu::kImageMaxGpus || r->hostname.size() > cuda_criu::kImageMaxStringBytes)
		std::abort();
	for (const auto &p : r->processes)
		if (p.gpu_uuids.size() > cuda_criu::kImageMaxGpus)
			std::abort();
}

// The GPU image's index: what decodes has every chunk inside its data file's recorded size and sorted,
// and encodes to the same index again.
void check_gpu_index(const uint8_t *data, size_t size)
{
	auto r = cuda_criu::decode_gpu_index(data, size);
	if (refused(r))
		return;
	for (const auto &p : r->processes) {
		uint64_t prev = 0;
		for (const auto &c : p.chunks) {
			if (c.addr < prev || c.len == 0 || c.len > r->chunk_bytes)
				std::abort();
			if (!r->criu_pages && (c.file >= r->files.size() || c.offset + c.stored() > r->files[c.file].size))
				std::abort();
			if (c.compressed() && (r->criu_pages || c.stored_len == 0 || c.stored_len >= c.len))
				std::abort();
			prev = c.addr + c.len;
		}
	}
	auto bytes = cuda_criu::encode_gpu_index(*r);
	auto again = cuda_criu::decode_gpu_index(bytes.data(), bytes.size());
	if (!again || again->processes.size() != r->processes.size() || again->files.size() != r->files.size())
		std::abort();
}

// The input as a stored chunk of each encoding, decoded into a chunk of 64 KiB with a guard page's worth
// of canaries behind it: decoded or refused with a message, nothing written past the chunk.
void check_chunk(const uint8_t *data, size_t size)
{
	constexpr size_t kLen = 64 << 10, kGuard = 4096;
	static cuda_criu::ChunkCodec codec;
	static std::vector<uint8_t> out(kLen + kGuard);
	for (uint32_t e = 0; e <= cuda_criu::kChunkEncodings; e++) {
		std::fill(out.begin() + kLen, out.end(), 0xa5);
		auto st = codec.decode(static_cast<cuda_criu::ChunkEncoding>(e), data, size, out.data(), kLen);
		if (!st && st.error().message().empty())
			std::abort();
		if (std::any_of(out.begin() + kLen, out.end(), [](uint8_t b) { return b != 0xa5; }))
			std::abort();
	}
}

// The input as CRIU's files.img after its two magic words (what a restore reads ahead by): decoded or
// refused, every name made of bytes of the input.
void check_criu_files(const uint8_t *data, size_t size)
{
	std::vector<uint8_t> framed = {0x19, 0x43, 0x56, 0x54, 0x38, 0x31, 0x30, 0x56};
	framed.insert(framed.end(), data, data + size);
	auto r = cuda_criu::decode_criu_reg_files(framed.data(), framed.size());
	if (!r && r.error().message().empty())
		std::abort();
	size_t bytes = 0;
	for (const cuda_criu::CriuRegFile &f : r ? *r : std::vector<cuda_criu::CriuRegFile>())
		bytes += f.name.size();
	if (bytes > size)
		std::abort();
}

// The input as CRIU's mm-N.img after its two magic words (what a restore reads its private file mappings
// from): decoded or refused, every mapping kept non-empty.
void check_criu_mm(const uint8_t *data, size_t size)
{
	std::vector<uint8_t> framed = {0x19, 0x43, 0x56, 0x54, 0x20, 0x28, 0x49, 0x57};
	framed.insert(framed.end(), data, data + size);
	auto r = cuda_criu::decode_criu_private_file_vmas(framed.data(), framed.size());
	if (!r && r.error().message().empty())
		std::abort();
	for (const cuda_criu::CriuFileVma &v : r ? *r : std::vector<cuda_criu::CriuFileVma>())
		if (v.end <= v.start)
			std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	check_chunk(data, size);
	check_criu_files(data, size);
	check_criu_mm(data, size);
	check_one(data, size);
	check_gpu_index(data, size);
	if (size > 0 && size <= (1u << 20)) { // as the payload of a well-formed cuda-gpu.img header
		std::vector<uint8_t> framed = {'C', 'U', 'D', 'A', 'G', 'P', 'U', 'I', 0, 0, 0, 0};
		for (int i = 0; i < 4; i++)
			framed[8 + i] = static_cast<uint8_t>(size >> (8 * i));
		framed.insert(framed.end(), data, data + size);
		check_gpu_index(framed.data(), framed.size());
	}
	// The same bytes as the payload of a well-formed header, so that mutations reach the protobuf
	// decoder instead of stopping at the magic or the length check.
	if (size > 0 && size <= cuda_criu::kImageMaxBytes) {
		std::vector<uint8_t> framed = {'C', 'U', 'D', 'A', 'C', 'R', 'I', 'U', 0, 0, 0, 0};
		for (int i = 0; i < 4; i++)
			framed[8 + i] = static_cast<uint8_t>(size >> (8 * i));
		framed.insert(framed.end(), data, data + size);
		check_one(framed.data(), framed.size());
	}
	// A small input standing for a large image: after a first byte 0xff, the second says how large
	// ((n + 1) x 16 KiB, up to the 4 MiB read_image() takes) and the rest is repeated to that size, so
	// that mutations reach images naming hundreds of thousands of processes or GPUs (libFuzzer's own
	// length limit grows too slowly to get there).
	if (size > 2 && size < 4096 && data[0] == 0xff) {
		size_t target = std::min<size_t>(cuda_criu::kImageMaxBytes, (static_cast<size_t>(data[1]) + 1) << 14);
		std::vector<uint8_t> big = {'C', 'U', 'D', 'A', 'C', 'R', 'I', 'U', 0, 0, 0, 0};
		while (big.size() - 12 + size - 2 <= target)
			big.insert(big.end(), data + 2, data + size);
		for (int i = 0; i < 4; i++)
			big[8 + i] = static_cast<uint8_t>((big.size() - 12) >> (8 * i));
		check_one(big.data(), big.size());
	}
	return 0;
}
