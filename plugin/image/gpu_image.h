// The GPU image: the processes' GPU state as the plugin stores it itself (gpu-image=plugin), in files
// beside CRIU's: data files cuda-gpu-N.img (one per writer thread, so that writes do not serialise on
// one inode) and their index cuda-gpu.img. Layout and rules: include/cuda_criu/cuda_plugin.proto
// (CudaGpuImage) and docs/gpu-image.md. This file knows the format and the files; what goes into them
// (which memory, zero pages, checksums, threads) is core/gpu_store.h's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "image/chunk_codec.h"
#include "os/unique_fd.h"

namespace cuda_criu {

inline constexpr const char *kGpuIndexFileName = "cuda-gpu.img";
inline constexpr uint32_t kGpuImageVersion = 3; // 3: compressed chunks; 2: data files of a parent image referenced; else 1
inline constexpr uint32_t kGpuMaxParentDepth = 64;
inline constexpr uint32_t kGpuChunkBytes = 2 << 20;    // a chunk: the unit of zero-skipping and of checksums
inline constexpr uint64_t kGpuDataHeaderBytes = 4096;  // at the head of each data file; data is page aligned
inline constexpr size_t kGpuIndexMaxBytes = 256 << 20; // 8 TiB of GPU state in 2 MiB chunks, with room
inline constexpr size_t kGpuMaxFiles = 1024;
// Listed in CRIU's inventory beside "cuda_plugin" when the plugin holds the GPU state: a restore without
// a plugin that takes it off the list (CRIU's own CUDA plugin, no plugin, an older cuda_plugin) fails
// with CRIU's "Missing required plugin: <this text>" instead of restoring zeros into the GPU. It must not
// begin with "cuda_plugin": CRIU matches inventory names by the prefix the plugin passes.
inline constexpr const char *kGpuImageInventoryName =
	"cuda-gpu-image (the GPU state is in cuda-gpu-*.img: restore with the cuda_plugin.so of cuda-criu)";

// "cuda-gpu-N.img"
std::string gpu_data_file_name(unsigned n);

struct GpuChunk {
	uint64_t addr = 0;   // in the process
	uint32_t len = 0;    // bytes, a multiple of the page size, at most kGpuChunkBytes
	uint32_t file = 0;   // index into GpuImageIndex::files
	uint64_t offset = 0; // in that file
	uint32_t crc = 0;    // CRC-32C of the len bytes
	// How they are stored at offset (image/chunk_codec.h): stored_len bytes, at most len (raw: len).
	ChunkEncoding encoding = ChunkEncoding::Raw;
	uint32_t stored_len = 0; // 0: raw, len bytes
	uint32_t stored() const { return stored_len ? stored_len : len; }
	bool compressed() const { return encoding != ChunkEncoding::Raw; }
	bool operator==(const GpuChunk &) const = default;
};

struct GpuProcessChunks {
	int ns_pid = 0;
	int pid = 0;
	std::vector<GpuChunk> chunks; // sorted by address
	uint64_t zero_bytes = 0;      // bytes of the checkpoint ranges in all-zero chunks (not stored)
	uint64_t stored_bytes() const;
	// Compressed chunks decoded into memory of their own (a restore's, CRIU maps it): one after the
	// other in index order, each at an offset congruent to its address modulo 2 MiB, so that the huge
	// pages of that memory can be mapped whole into the process (a gap takes no memory). Each chunk's
	// offset there (meaningful for compressed ones), then the total.
	std::vector<uint64_t> decoded_offsets() const;
	uint64_t decoded_bytes() const;
};

struct GpuDataFile {
	std::string name;
	uint64_t size = 0;       // header and holes included
	uint64_t data_bytes = 0; // bytes written
	// A file of a parent image (criu dump --prev-images-dir) whose chunks this image references: it lies
	// in "parent/" depth times over, and its header carries id, the parent's GPU image id.
	uint32_t parent_depth = 0;
	std::string id;
	// The path from the image directory: "cuda-gpu-0.img", "parent/parent/cuda-gpu-3.img".
	std::string path() const;
	bool operator==(const GpuDataFile &) const = default;
};

struct GpuImageIndex {
	std::string id; // = ImageRecord::gpu_image_id; also in each data file's header
	uint32_t chunk_bytes = kGpuChunkBytes;
	std::vector<GpuDataFile> files;
	std::vector<GpuProcessChunks> processes;
	uint64_t write_us = 0;
	// Only checksums: CRIU's pages images hold the GPU state (every chunk listed, no data file).
	bool criu_pages = false;
	// Bytes of stored chunks that lie in a parent image's files (referenced, not written by this dump).
	uint64_t parent_bytes() const;
	const GpuProcessChunks *find(int ns_pid) const;
};

// A fresh random id for one dump's GPU image (32 hex digits).
std::string new_gpu_image_id();

std::vector<uint8_t> encode_gpu_index(const GpuImageIndex &index);
// Parses and checks an index: every chunk inside its file's recorded size, page aligned, no chunk over
// chunk_bytes, file names plain; each error says what is wrong.
Result<GpuImageIndex> decode_gpu_index(const uint8_t *data, size_t size);
Status write_gpu_index(int dir_fd, const GpuImageIndex &index);
// nullopt when the directory has no cuda-gpu.img.
Result<std::optional<GpuImageIndex>> read_gpu_index(int dir_fd);

// The GPU image of the parent image (CRIU's "parent" link, made by criu dump --prev-images-dir), when it
// has one with data files: its chunks may be referenced by this dump instead of written again.
struct GpuParentImage {
	UniqueFd dir;
	GpuImageIndex index;
};
Result<std::optional<GpuParentImage>> read_parent_gpu_image(int dir_fd);

// Removes a GPU image's data files and its index from dir_fd (a failed dump's: they could never restore,
// and can be large). Missing files are no error.
void remove_gpu_image(int dir_fd, const std::vector<GpuDataFile> &files);

// One data file being written: created with its header; chunks are written at offsets the caller
// chooses (pwrite, so several files fill in parallel); finish() sets its final size.
class GpuDataWriter {
public:
	static Result<GpuDataWriter> create(int dir_fd, const std::string &name, const std::string &id);
	Status write(uint64_t offset, const void *data, size_t len);
	Status finish(uint64_t size);
	const std::string &name() const { return name_; }

private:
	GpuDataWriter(UniqueFd fd, std::string name) : fd_(std::move(fd)), name_(std::move(name)) {}
	UniqueFd fd_;
	std::string name_;
};

// One data file being read: open() checks its header against the index's id (a parent's file: against
// the id recorded for it) and its size against the index (a file cut short, or one of another dump, is
// refused by name before any chunk is read; a parent's file that is missing or changed says so).
class GpuDataReader {
public:
	static Result<GpuDataReader> open(int dir_fd, const GpuDataFile &file, const std::string &id);
	// Every data file of the index, in its order.
	static Result<std::vector<GpuDataReader>> open_all(int dir_fd, const GpuImageIndex &index);
	// Exactly len bytes at offset, or an error naming the file and offset.
	Status read(uint64_t offset, void *data, size_t len) const;
	const std::string &name() const { return name_; }

private:
	GpuDataReader(UniqueFd fd, std::string name) : fd_(std::move(fd)), name_(std::move(name)) {}
	UniqueFd fd_;
	std::string name_;
};

} // namespace cuda_criu
