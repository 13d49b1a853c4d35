// Rewrites a cuda-plugin.img with changed fields, to make hostile images for the end-to-end tests:
//   image_edit IN OUT [--pid OLD=NEW]... [--gpu-uuid UUID] [--gpu-name NAME]
// --pid changes a process's pid and namespace pid; --gpu-uuid and --gpu-name change the first GPU of
// the image (and every process's reference to it).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "image/image.h"

int main(int argc, char **argv)
{
	if (argc < 3) {
		std::fprintf(stderr, "usage: %s IN OUT [--pid OLD=NEW]... [--gpu-uuid UUID] [--gpu-name NAME]\n", argv[0]);
		return 2;
	}
	std::ifstream in(argv[1], std::ios::binary);
	std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
	auto r = cuda_criu::decode_image(data.data(), data.size());
	if (!r) {
		std::fprintf(stderr, "%s: %s\n", argv[1], r.error().message().c_str());
		return 1;
	}
	cuda_criu::ImageRecord rec = std::move(*r);
	for (int i = 3; i + 1 < argc; i += 2) {
		std::string opt = argv[i], val = argv[i + 1];
		if (opt == "--pid") {
			int from = std::atoi(val.c_str()), to = std::atoi(val.substr(val.find('=') + 1).c_str());
			bool found = false;
			for (auto &p : rec.processes)
				if (p.pid == from) {
					p.pid = p.ns_pid = to;
					found = true;
				}
			if (!found) {
				std::fprintf(stderr, "no process %d in %s\n", from, argv[1]);
				return 1;
			}
		} else if ((opt == "--gpu-uuid" || opt == "--gpu-name") && !rec.gpus.empty()) {
			if (opt == "--gpu-name") {
				rec.gpus[0].name = val;
				continue;
			}
			auto uuid = cuda_criu::GpuUuid::parse(val);
			if (!uuid) {
				std::fprintf(stderr, "--gpu-uuid: %s\n", uuid.error().message().c_str());
				return 2;
			}
			for (auto &p : rec.processes)
				for (auto &u : p.gpu_uuids)
					if (u == rec.gpus[0].uuid)
						u = *uuid;
			rec.gpus[0].uuid = *uuid;
		} else {
			std::fprintf(stderr, "unknown option %s (or no GPU in the image)\n", opt.c_str());
			return 2;
		}
	}
	std::vector<uint8_t> out = cuda_criu::encode_image(rec);
	std::ofstream o(argv[2], std::ios::binary | std::ios::trunc);
	o.write(reinterpret_cast<const char *>(out.data()), static_cast<std::streamsize>(out.size()));
	return o ? 0 : 1;
}
