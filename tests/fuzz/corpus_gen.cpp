// Writes the seed corpus of the image fuzzer: a few small valid images made by encode_image ("ok-*")
// and malformed variants of them ("bad-*"). The files in tests/fuzz/corpus/ were made with it:
//   image_corpus_gen tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "image/chunk_codec.h"
#include "image/gpu_image.h"
#include "image/image.h"

namespace {

using cuda_criu::CudaState;
using cuda_criu::GpuUuid;
using cuda_criu::ImageRecord;

GpuUuid uuid(const char *text) { return *GpuUuid::parse(text); }
using Bytes = std::vector<uint8_t>;

constexpr size_t kHeader = 12; // "CUDACRIU" + little-endian uint32 length

ImageRecord one_process()
{
	ImageRecord r;
	r.driver_version = "580.159.04";
	r.plugin_version = "0.1.0";
	r.gpus.push_back({uuid("GPU-01234567-89ab-cdef-0123-456789abcdef"), "NVIDIA H200", 150000000000ULL, "0000:19:00.0", 0});
	r.processes.push_back({4242, 1, CudaState::Running, {uuid("GPU-01234567-89ab-cdef-0123-456789abcdef")}, 64ULL << 20, 900, 41000});
	r.device_phase_us = 41000;
	r.created_unix = 1764460800;
	r.hostname = "node1";
	return r;
}

ImageRecord tree()
{
	ImageRecord r = one_process();
	r.gpus.push_back({uuid("GPU-fedcba98-7654-3210-fedc-ba9876543210"), "NVIDIA H200", 150000000000ULL, "0000:2a:00.0", 1});
	r.processes.push_back({4243, 2, CudaState::Locked, {uuid("GPU-fedcba98-7654-3210-fedc-ba9876543210")}, 0, 0, 0});
	r.processes.push_back({4244, 3, CudaState::Checkpointed, {}, 32ULL << 20, 0, 0});
	return r;
}

void set_length(Bytes &b, uint32_t len)
{
	for (int i = 0; i < 4; i++)
		b[8 + i] = static_cast<uint8_t>(len >> (8 * i));
}

Bytes with_payload(const Bytes &payload)
{
	Bytes b = {'C', 'U', 'D', 'A', 'C', 'R', 'I', 'U', 0, 0, 0, 0};
	b.insert(b.end(), payload.begin(), payload.end());
	set_length(b, static_cast<uint32_t>(payload.size()));
	return b;
}

bool write_file(const std::string &path, const Bytes &b)
{
	std::ofstream out(path, std::ios::binary | std::ios::trunc);
	out.write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
	return static_cast<bool>(out);
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 2) {
		std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	const std::string dir = argv[1];
	std::vector<std::pair<std::string, Bytes>> files;

	ImageRecord empty;
	files.emplace_back("ok-empty-record", cuda_criu::encode_image(empty));
	Bytes one = cuda_criu::encode_image(one_process());
	files.emplace_back("ok-one-process", one);
	files.emplace_back("ok-tree", cuda_criu::encode_image(tree()));
	// The driver's copy's ranges and the pages of mapped files in use, as a dump notes them.
	ImageRecord ranges = one_process();
	ranges.processes[0].checkpoint_ranges = {{0x7f1000000000, 0x7f1004000000}};
	ranges.processes[0].file_pages = {{0x400000, 0x420000}, {0x7f2000000000, 0x7f2000200000}};
	files.emplace_back("ok-ranges", cuda_criu::encode_image(ranges));
	// Only the required fields: an image from a writer that set nothing optional.
	files.emplace_back("ok-required-only", with_payload({0x08, 0x01, 0x2a, 0x04, 0x08, 0x07, 0x10, 0x07}));

	files.emplace_back("bad-empty-file", Bytes{});
	files.emplace_back("bad-header-only-magic", Bytes(one.begin(), one.begin() + 8));
	files.emplace_back("bad-truncated-header", Bytes(one.begin(), one.begin() + 10));
	files.emplace_back("bad-truncated-payload", Bytes(one.begin(), one.begin() + static_cast<long>(one.size() / 2)));
	Bytes b = one;
	b.push_back(0);
	files.emplace_back("bad-padded", b);
	b = one;
	b[0] = 'X';
	files.emplace_back("bad-magic", b);
	b = one;
	b[13] = static_cast<uint8_t>(cuda_criu::kImageVersion + 1);
	files.emplace_back("bad-newer-version", b);
	b = one;
	b[13] = 0;
	files.emplace_back("bad-version-zero", b);
	b = one;
	set_length(b, 0xffffffffu);
	files.emplace_back("bad-length-huge", b);
	b = one;
	for (size_t i = kHeader; i < b.size(); i += 3)
		b[i] = 0xff;
	files.emplace_back("bad-corrupt-payload", b);
	ImageRecord r = one_process();
	r.processes[0].pid = 0;
	files.emplace_back("bad-pid-zero", cuda_criu::encode_image(r));
	r.processes[0].pid = -5;
	files.emplace_back("bad-pid-negative", cuda_criu::encode_image(r));
	// A message without its required version field.
	files.emplace_back("bad-no-version", with_payload({0x12, 0x01, 0x31}));
	// A length-delimited field that claims far more bytes than there are.
	files.emplace_back("bad-field-overrun", with_payload({0x08, 0x01, 0x2a, 0xff, 0xff, 0xff, 0xff, 0x0f}));

	// The GPU image's index (cuda-gpu.img): one process with three chunks in two data files.
	cuda_criu::GpuImageIndex idx;
	idx.id = std::string(32, 'a');
	// The second data file is a parent image's (an incremental dump's reference).
	idx.files = {{"cuda-gpu-0.img", 4096 + (4 << 20), 4 << 20, 0, ""},
		     {"cuda-gpu-1.img", 4096 + (2 << 20), 1 << 20, 1, std::string(32, 'b')}};
	idx.processes.push_back({7, 4242, {{0x7f0000000000, 2 << 20, 0, 4096, 0x1234}, {0x7f0000200000, 2 << 20, 0, 4096 + (2 << 20), 1},
					 {0x7f0000600000, 2 << 20, 1, 4096, 2}}, 2 << 20});
	files.emplace_back("gpu-index", cuda_criu::encode_gpu_index(idx));
	// The same with compressed chunks (format 3): zstd of the shuffled bytes, zstd, and a raw one.
	idx.processes[0].chunks[0].encoding = cuda_criu::ChunkEncoding::ZstdShuffled;
	idx.processes[0].chunks[0].stored_len = 700 << 10;
	idx.processes[0].chunks[1].encoding = cuda_criu::ChunkEncoding::Zstd;
	idx.processes[0].chunks[1].stored_len = 4096;
	files.emplace_back("gpu-index-compressed", cuda_criu::encode_gpu_index(idx));

	// Compressed chunks as the GPU image stores them (what the chunk decoder is fuzzed with): 64 KiB of
	// bf16-like weights, shuffled and as they are, and of text.
	cuda_criu::ChunkCodec codec;
	Bytes weights(64 << 10), text(64 << 10);
	for (size_t i = 0; i < weights.size(); i++) {
		weights[i] = static_cast<uint8_t>(i % 2 ? 0x3c + (i * 7919) % 3 : (i * 2654435761u) >> 24);
		text[i] = static_cast<uint8_t>("seed corpus of the chunk decoder "[i % 33]);
	}
	for (const auto &[name, bytes] : {std::pair<const char *, const Bytes &>{"chunk-weights", weights},
					 std::pair<const char *, const Bytes &>{"chunk-text", text}}) {
		cuda_criu::ChunkCodec::Encoded e = codec.encode(bytes.data(), bytes.size(), 1);
		Bytes stored(codec.out(), codec.out() + e.stored_len);
		files.emplace_back(name, stored);
	}

	for (const auto &[name, bytes] : files)
		if (!write_file(dir + "/" + name, bytes)) {
			std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name.c_str());
			return 1;
		}
	std::printf("%zu files in %s\n", files.size(), dir.c_str());
	return 0;
}
