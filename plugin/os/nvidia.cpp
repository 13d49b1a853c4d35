#include "os/nvidia.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "base/text.h"
#include "os/dir.h"

namespace cuda_criu {
namespace {

constexpr const char *kProcDir = "/proc/driver/nvidia";

std::string value_of(const std::string &line)
{
	size_t v = line.find_first_not_of(" \t", line.find(':') + 1);
	return v == std::string::npos ? std::string() : line.substr(v);
}

} // namespace

bool nvidia_kernel_driver_loaded()
{
	struct stat st;
	return stat(kProcDir, &st) == 0;
}

bool nvidia_driver_present(const std::string &libcuda_path)
{
	if (!libcuda_path.empty()) {
		struct stat st;
		return stat(libcuda_path.c_str(), &st) == 0;
	}
	return !dir_entries(std::string(kProcDir) + "/gpus").empty();
}

std::string kernel_driver_version()
{
	std::string v;
	if (auto text = read_small_file("/sys/module/nvidia/version"); text && std::istringstream(*text) >> v)
		return v;
	// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu ..."
	auto text = read_small_file(std::string(kProcDir) + "/version");
	if (!text)
		return {};
	std::istringstream in(*text);
	std::string word, prev;
	while (in >> word) {
		if (prev == "Module")
			return word;
		prev = word;
	}
	return {};
}

std::vector<GpuInfo> kernel_gpus()
{
	std::vector<GpuInfo> out;
	const std::string dir = std::string(kProcDir) + "/gpus/";
	for (const std::string &name : dir_entries(dir)) {
		auto text = read_small_file(dir + name + "/information");
		if (!text)
			continue;
		std::istringstream in(*text);
		std::string line;
		GpuInfo g;
		g.ordinal = -1;
		bool has_uuid = false;
		while (std::getline(in, line)) {
			if (line.rfind("Model:", 0) == 0)
				g.name = value_of(line);
			else if (line.rfind("Device Minor:", 0) == 0)
				g.ordinal = std::atoi(value_of(line).c_str());
			else if (line.rfind("Bus Location:", 0) == 0)
				g.pci_bus_id = value_of(line);
			else if (line.rfind("GPU UUID:", 0) == 0)
				if (auto u = GpuUuid::parse(value_of(line)))
					g.uuid = *u, has_uuid = true;
		}
		if (has_uuid && g.ordinal >= 0)
			out.push_back(g);
	}
	std::sort(out.begin(), out.end(), [](const GpuInfo &a, const GpuInfo &b) { return a.ordinal < b.ordinal; });
	return out;
}

} // namespace cuda_criu
