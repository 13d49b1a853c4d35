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

std::string image_still_mapped(const std::vector<Mapping> &maps, const std::string &image_dir)
{
	std::string out;
	for (const Mapping &m : pages_image_mappings(maps, image_dir))
		out += format("%s%#" PRIx64 "-%#" PRIx64 " of %s", out.empty() ? "" : ", ", m.start, m.end,
			      m.path.c_str());
	return out;
}

} // namespace cuda_criu
