#include "core/space_check.h"

#include "base/format.h"
#include "base/text.h"

namespace cuda_criu {

ImageSpaceEstimate estimate_image_space(const ImageSpaceNeed &need)
{
	ImageSpaceEstimate e;
	// The floor counts only pages the dump cannot leave out: the processes' private memory (unless a
	// parent image holds part of it) and, when CRIU stores it, the driver's copy of the GPU memory, zeros
	// and all. The plugin's GPU image leaves all-zero pages out: any share of it may be zeros.
	e.floor = need.ordinary_is_floor ? need.ordinary_bytes : 0;
	if (need.gpu_known && !need.gpu_sparse)
		e.floor += need.gpu_bytes;
	e.estimate = need.ordinary_bytes + (need.gpu_known ? need.gpu_bytes : 0);
	return e;
}

namespace {

std::string what_is_counted(const ImageSpaceNeed &need)
{
	std::string s = need.pages_elsewhere
				? format("private memory of %zu process(es) sent to the page server", need.processes)
				: format("private memory %s of %zu process(es)", human_bytes(need.ordinary_bytes).c_str(),
					 need.processes);
	if (!need.ordinary_is_floor)
		s += " (an incremental dump writes only what changed)";
	if (!need.gpu_known)
		return s + format(", GPU memory of %zu CUDA process(es) unknown (no NVML)", need.cuda_processes);
	return s + format(", GPU memory %s of %zu CUDA process(es) (%s)", human_bytes(need.gpu_bytes).c_str(),
			  need.cuda_processes,
			  need.gpu_sparse ? "its all-zero pages are left out of the GPU image"
					  : "written in full: gpu-image=criu");
}

} // namespace

ImageSpaceVerdict check_image_space(const ImageSpaceNeed &need, const FreeSpace &space)
{
	ImageSpaceEstimate e = estimate_image_space(need);
	ImageSpaceVerdict v;
	std::string counted = what_is_counted(need);
	v.summary = format("space preflight: %s has %s free (of %s); the image needs at least %s, up to %s: %s",
			   space.path.c_str(), human_bytes(space.free_bytes).c_str(), human_bytes(space.size_bytes).c_str(),
			   human_bytes(e.floor).c_str(), human_bytes(e.estimate).c_str(), counted.c_str());
	if (e.floor > space.free_bytes) {
		v.refusal = make_error(ENOSPC,
				       "not enough room for the image in %s: its file system has %s free, but this dump "
				       "writes at least %s there (up to %s; %s). Free %s there, dump into a directory with "
				       "room (criu dump -D), or set CUDA_CRIU_SPACE_CHECK=warn to try anyway",
				       space.path.c_str(), human_bytes(space.free_bytes).c_str(), human_bytes(e.floor).c_str(),
				       human_bytes(e.estimate).c_str(), counted.c_str(),
				       human_bytes(e.floor - space.free_bytes).c_str());
		return v;
	}
	if (e.estimate > space.free_bytes)
		v.warning = format("the image may not fit in %s: its file system has %s free; this dump writes at least "
				   "%s and up to %s (%s). Dumping anyway: if the directory fills up, the dump fails and "
				   "every process runs on as it was (then free space there or dump elsewhere, criu dump -D)",
				   space.path.c_str(), human_bytes(space.free_bytes).c_str(), human_bytes(e.floor).c_str(),
				   human_bytes(e.estimate).c_str(), counted.c_str());
	return v;
}

} // namespace cuda_criu
