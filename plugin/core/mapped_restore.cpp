#include "core/mapped_restore.h"

#include <cerrno>
#include <cinttypes>
#include <cstring>

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

std::set<int> request_mapped_gpu_image(const GpuImageIndex &index, bool enabled, const MapFile &map)
{
	// Each run splits a vma in the restored process: stay far below vm.max_map_count.
	constexpr size_t kMaxRuns = 4096;
	std::set<int> mapped;
	if (!enabled || !map) {
		LOG_INFO("the GPU image is written into the processes by the plugin: %s",
			 !enabled ? "mapping it is off (CUDA_CRIU_MAP_IMAGE=off)"
				  : "this CRIU cannot map a plugin's files (it lacks criu_restore_map_file, see criu-patches/)");
		return mapped;
	}
	for (const GpuProcessChunks &p : index.processes) {
		struct Run {
			uint64_t start, end, offset;
			uint32_t file;
		};
		std::vector<Run> runs;
		uint64_t written_by_plugin = 0;
		for (const GpuChunk &c : p.chunks) {
			if (index.files[c.file].parent_depth || c.compressed()) { // written by the plugin, never mapped
				written_by_plugin += c.len;
				continue;
			}
			if (!runs.empty() && runs.back().end == c.addr && runs.back().file == c.file &&
			    runs.back().offset + (runs.back().end - runs.back().start) == c.offset)
				runs.back().end += c.len;
			else
				runs.push_back({c.addr, c.addr + c.len, c.offset, c.file});
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
		for (const Run &r : runs)
			if (int rc = map(p.ns_pid, r.start, r.end, index.files[r.file].name.c_str(), r.offset); rc < 0) {
				LOG_WARN("pid %d: CRIU refused to map %#" PRIx64 "-%#" PRIx64 " from %s (%s); the plugin writes "
					 "its GPU state into the process instead",
					 p.ns_pid, r.start, r.end, index.files[r.file].name.c_str(), std::strerror(-rc));
				all = false;
				break;
			}
		if (all) {
			mapped.insert(p.ns_pid);
			LOG_INFO("pid %d: asking CRIU to map its GPU image (%.1f MiB in %zu run(s)) from the plugin's files%s",
				 p.ns_pid, static_cast<double>(p.stored_bytes() - written_by_plugin) / (1 << 20), runs.size(),
				 written_by_plugin ? format("; %.1f MiB compressed or in the parent image are written by the plugin",
						      static_cast<double>(written_by_plugin) / (1 << 20)).c_str()
					     : "");
		}
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
