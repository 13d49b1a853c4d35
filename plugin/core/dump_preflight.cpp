#include "core/dump_preflight.h"

#include <vector>

#include "base/log.h"
#include "core/memory_check.h"
#include "core/space_check.h"

namespace cuda_criu {

namespace {

// The tree from root down, parents before children.
std::vector<pid_t> tree_of(Host &host, pid_t root)
{
	std::vector<pid_t> tree{root};
	for (size_t i = 0; i < tree.size(); i++)
		for (pid_t c : host.children(tree[i]))
			tree.push_back(c);
	return tree;
}

} // namespace

TreeGpuMemory tree_gpu_memory(const SharedDriver &driver, unsigned timeout_ms)
{
	auto usage = ask<std::map<pid_t, uint64_t>>(driver, timeout_ms, "ask NVML for the GPU memory of each process",
						    [](Driver &d) -> Result<std::map<pid_t, uint64_t>> {
							    if (auto m = d.gpu_bytes_by_process())
								    return std::move(*m);
							    return make_error(ENOSYS, "%s", "NVML cannot tell");
						    });
	if (!usage) {
		LOG_INFO("no memory preflight: %s", usage.error().message().c_str());
		return {};
	}
	return {std::move(*usage), true};
}

// The CUDA processes of the tree with the GPU memory NVML reports for each. Without NVML there is nothing
// to compare: the check is skipped.
Status preflight_memory(const Options &options, Host &host, pid_t root, const TreeGpuMemory &gpu)
{
	if (!gpu.known || options.memory_check == MemoryCheck::Off)
		return {};
	std::vector<CheckpointNeed> needs;
	for (pid_t pid : tree_of(host, root)) {
		auto it = gpu.bytes.find(pid);
		if (it != gpu.bytes.end() && it->second && host.uses_libcuda(pid))
			needs.push_back({pid, it->second, host.memory_cgroup(pid)});
	}
	Status st = check_checkpoint_memory(needs, host.available_memory());
	if (!st && options.memory_check == MemoryCheck::Warn) {
		LOG_WARN("%s (memory-check=warn: dumping anyway)", st.error().message().c_str());
		return {};
	}
	return st;
}

// The tree's private memory and the CUDA processes' GPU memory against the free space of the image
// directory. Skipped where the pages do not go there (CRIU's command line says so; a CRIU driven over
// RPC shows no options) or the free space is unknown.
Status preflight_space(const Options &options, Host &host, pid_t root, int image_dir_fd, const TreeGpuMemory &gpu)
{
	if (options.space_check == SpaceCheck::Off || image_dir_fd < 0)
		return {};
	ImageSpaceNeed need;
	for (const std::string &a : host.command_line()) {
		for (const char *elsewhere : {"--page-server", "--lazy-pages", "--stream"})
			if (a == elsewhere && (a != "--page-server" || options.gpu_image != GpuImage::Plugin)) {
				LOG_INFO("no space preflight: the pages do not go into the image directory (%s)", elsewhere);
				return {};
			}
		// The pages go to the page server; the plugin's GPU image still comes here.
		need.pages_elsewhere |= a == "--page-server";
		if (a.rfind("--prev-images-dir", 0) == 0)
			need.ordinary_is_floor = false;
	}
	auto space = host.free_space_at(image_dir_fd);
	if (!space) {
		LOG_INFO("no space preflight: the room in the image directory is unknown (%s)",
			 space.error().message().c_str());
		return {};
	}
	need.gpu_known = gpu.known;
	need.gpu_sparse = options.gpu_image == GpuImage::Plugin;
	for (pid_t pid : tree_of(host, root)) {
		need.processes++;
		need.ordinary_bytes += need.pages_elsewhere ? 0 : host.task_info(pid).anon_bytes;
		if (host.uses_libcuda(pid)) {
			need.cuda_processes++;
			if (auto it = gpu.bytes.find(pid); it != gpu.bytes.end())
				need.gpu_bytes += it->second;
		}
	}
	ImageSpaceVerdict v = check_image_space(need, *space);
	LOG_INFO("%s", v.summary.c_str());
	if (!v.refusal && options.space_check == SpaceCheck::Warn) {
		LOG_WARN("%s (space-check=warn: dumping anyway)", v.refusal.error().message().c_str());
		return {};
	}
	if (!v.refusal)
		return std::move(v.refusal).error();
	if (!v.warning.empty())
		LOG_WARN("%s", v.warning.c_str());
	return {};
}

} // namespace cuda_criu
