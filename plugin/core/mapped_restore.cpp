#include "core/mapped_restore.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <tuple>

#include "base/crc32c.h"
#include "base/format.h"
#include "base/log.h"

namespace cuda_criu {

size_t request_mapped_restore(const ImageRecord &image, bool enabled, const MapFromImage &map)
{
	size_t ranges = 0;
	for (const ProcessRecord &p : image.processes)
		ranges += p.checkpoint_ranges.size();
	if (!ranges) {
		LOG_INFO("normal restore: the image records no memory of the driver's checkpoint (written by an older "
			 "plugin, or the driver's copy is not in private anonymous memory)");
		return 0;
	}
	if (!enabled) {
		LOG_INFO("normal restore: mapping the GPU state from the image is off (CUDA_CRIU_MAP_IMAGE=off)");
		return 0;
	}
	if (!map) {
		LOG_INFO("normal restore: this CRIU cannot map pages from the image (it lacks "
			 "criu_restore_map_from_image, see criu-patches/)");
		return 0;
	}
	size_t asked = 0;
	for (const ProcessRecord &p : image.processes) {
		uint64_t bytes = 0;
		size_t n = 0;
		for (const MemoryRange &r : p.checkpoint_ranges) {
			// CRIU knows the task by its pid in the image: the pid in its own namespace.
			if (int rc = map(p.ns_pid, r.start, r.end); rc < 0) {
				LOG_WARN("pid %d: CRIU refused to map %#" PRIx64 "-%#" PRIx64 " from the image (%s); that "
					 "memory is read as usual",
					 p.ns_pid, r.start, r.end, std::strerror(-rc));
				continue;
			}
			bytes += r.end - r.start;
			n++;
		}
		if (n)
			LOG_INFO("pid %d: asking CRIU to map its GPU state (%.1f MiB in %zu range(s)) from the image",
				 p.ns_pid, static_cast<double>(bytes) / (1 << 20), n);
		asked += n;
	}
	return asked;
}

namespace {

// A run of a process's GPU image that CRIU maps: from a data file of the image, or from the memory its
// compressed chunks are decoded into (file kDecoded).
struct Run {
	static constexpr uint32_t kDecoded = UINT32_MAX;
	uint64_t start, end, offset;
	uint32_t file;
};

void add_run(std::vector<Run> &runs, uint64_t addr, uint32_t len, uint64_t offset, uint32_t file)
{
	if (!runs.empty() && runs.back().end == addr && runs.back().file == file &&
	    runs.back().offset + (runs.back().end - runs.back().start) == offset)
		runs.back().end += len;
	else
		runs.push_back({addr, addr + len, offset, file});
}

} // namespace

// Names p's decoded state among restores on this host (os/decoded_share.h): the image's id, the process,
// and a digest of what decodes into which bytes.
std::string decoded_key(const GpuImageIndex &index, const GpuProcessChunks &p)
{
	uint32_t digest = crc32c(&index.chunk_bytes, sizeof(index.chunk_bytes));
	for (const GpuChunk &c : p.chunks) {
		uint64_t fields[] = {c.addr, c.len, c.crc, static_cast<uint64_t>(c.encoding)};
		digest = crc32c(fields, sizeof(fields), digest);
	}
	return format("%s-%d-%08x", index.id.c_str(), p.ns_pid, digest);
}

MappedGpuImage request_mapped_gpu_image(const GpuImageIndex &index, bool enabled, const MapFile &map,
					const MapFd &map_fd, const GpuLedgerPlace *share_place,
					const MapFdUserfault &userfault)
{
	// Each run splits a vma in the restored process: stay far below vm.max_map_count.
	constexpr size_t kMaxRuns = 4096;
	MappedGpuImage mapped;
	if (!enabled || !map) {
		LOG_INFO("the GPU image is written into the processes by the plugin: %s",
			 !enabled ? "mapping it is off (CUDA_CRIU_MAP_IMAGE=off)"
				  : "this CRIU cannot map a plugin's files (it lacks criu_restore_map_file, see criu-patches/)");
		return mapped;
	}
	for (const GpuProcessChunks &p : index.processes) {
		bool in_parent = std::any_of(p.chunks.begin(), p.chunks.end(),
					     [&](const GpuChunk &c) { return index.files[c.file].parent_depth != 0; });
		// Compressed chunks are decoded into memory CRIU maps, on a CRIU that maps a plugin's memory and
		// for a process the plugin does not write into anyway (chunks in a parent image's files).
		std::shared_ptr<MemFile> decoded;
		std::shared_ptr<DecodedShare> share;
		if (uint64_t bytes = p.decoded_bytes(); bytes && map_fd && !in_parent) {
			auto f = DecodedShare::open(share_place, decoded_key(index, p), format("cuda-criu-gpu-%d", p.ns_pid), bytes);
			if (f)
				std::tie(decoded, share) = std::move(*f);
			else
				LOG_WARN("pid %d: %s; the plugin writes its compressed GPU state into the process instead",
					 p.ns_pid, f.error().message().c_str());
		}
		std::vector<uint64_t> decoded_at = p.decoded_offsets();
		std::vector<Run> runs;
		uint64_t written_by_plugin = 0, from_memory = 0;
		for (size_t i = 0; i < p.chunks.size(); i++) {
			const GpuChunk &c = p.chunks[i];
			if (index.files[c.file].parent_depth || (c.compressed() && !decoded)) { // written by the plugin
				written_by_plugin += c.len;
			} else if (c.compressed()) {
				add_run(runs, c.addr, c.len, decoded_at[i], Run::kDecoded);
				from_memory += c.len;
			} else {
				add_run(runs, c.addr, c.len, c.offset, c.file);
			}
		}
		if (runs.empty())
			continue;
		if (runs.size() > kMaxRuns) {
			LOG_INFO("pid %d: its GPU image is in %zu separate runs (more than %zu): the plugin writes it into the "
				 "process instead of mapping it",
				 p.ns_pid, runs.size(), kMaxRuns);
			continue;
		}
		bool all = true;
		for (const Run &r : runs) {
			bool mem = r.file == Run::kDecoded;
			const char *from = mem ? "the memory its compressed chunks are decoded into" : index.files[r.file].name.c_str();
			int rc = mem ? map_fd(p.ns_pid, r.start, r.end, decoded->fd(), r.offset)
				     : map(p.ns_pid, r.start, r.end, from, r.offset);
			if (rc < 0) {
				LOG_WARN("pid %d: CRIU refused to map %#" PRIx64 "-%#" PRIx64 " from %s (%s); the plugin writes "
					 "its GPU state into the process instead",
					 p.ns_pid, r.start, r.end, from, std::strerror(-rc));
				all = false;
				break;
			}
		}
		if (!all)
			continue;
		mapped.processes.insert(p.ns_pid);
		if (decoded)
			mapped.decoded.emplace(p.ns_pid, decoded);
		if (share)
			mapped.shares.emplace(p.ns_pid, share);
		// Decoded here: the driver may read it before it is whole, each first touch waiting for its chunk.
		if (decoded && !(share && share->joined()) && userfault) {
			if (int rc = userfault(p.ns_pid); rc < 0) {
				LOG_INFO("pid %d: its decoded GPU state is read once whole (CRIU cannot have it come in on demand: "
					 "%s)",
					 p.ns_pid, std::strerror(-rc));
			} else {
				std::vector<MemoryRange> chunks;
				for (const GpuChunk &c : p.chunks)
					if (c.compressed() && !index.files[c.file].parent_depth)
						chunks.push_back({c.addr, c.addr + c.len});
				mapped.lazy->add(p.ns_pid, std::move(chunks));
			}
		}
		if (share && share->joined())
			LOG_INFO("pid %d: its compressed GPU state is being decoded by another restore of the same image (CRIU "
				 "pid %d): this restore maps the same memory and waits for it instead of decoding",
				 p.ns_pid, share->publisher());
		uint64_t from_files = p.stored_bytes() - written_by_plugin - from_memory;
		LOG_INFO("pid %d: asking CRIU to map its GPU image in %zu run(s): %.1f MiB from the plugin's files%s%s",
			 p.ns_pid, runs.size(), static_cast<double>(from_files) / (1 << 20),
			 from_memory ? format(", %.1f MiB from the memory its compressed chunks are decoded into while CRIU "
					      "restores (%s)",
					      static_cast<double>(from_memory) / (1 << 20),
					      decoded->huge() ? "2 MiB pages" : "a memfd, pages as the host's shmem_enabled says")
						.c_str()
				     : "",
			 written_by_plugin ? format("; %.1f MiB compressed or in the parent image are written by the plugin",
						    static_cast<double>(written_by_plugin) / (1 << 20)).c_str()
					   : "");
	}
	return mapped;
}

std::string image_still_mapped(const std::vector<Mapping> &maps, const std::string &image_dir)
{
	std::string out;
	for (const Mapping &m : pages_image_mappings(maps, image_dir))
		out += format("%s%#" PRIx64 "-%#" PRIx64 " of %s", out.empty() ? "" : ", ", m.start, m.end,
			      m.path.c_str());
	return out;
}

} // namespace cuda_criu
