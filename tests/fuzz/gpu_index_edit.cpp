// Rewrites the GPU image's index (cuda-gpu.img) of an image directory with a lie about its first
// compressed chunk, to make hostile images for the end-to-end tests:
//   gpu_index_edit DIR [--stored-len N] [--encoding E] [--len N]
// Prints the chunk edited: "FILE OFFSET ADDR".
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "image/gpu_image.h"

int main(int argc, char **argv)
{
	if (argc < 2 || argc % 2) {
		std::fprintf(stderr, "usage: %s DIR [--stored-len N] [--encoding E] [--len N]\n", argv[0]);
		return 2;
	}
	int dir = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	auto idx = cuda_criu::read_gpu_index(dir);
	if (dir < 0 || !idx || !*idx) {
		std::fprintf(stderr, "%s: no GPU image index%s%s\n", argv[1], idx ? "" : ": ",
			     idx ? "" : idx.error().message().c_str());
		return 1;
	}
	for (auto &p : (*idx)->processes)
		for (auto &c : p.chunks) {
			if (!c.compressed())
				continue;
			for (int i = 2; i + 1 < argc; i += 2) {
				std::string opt = argv[i];
				auto v = static_cast<uint32_t>(std::strtoul(argv[i + 1], nullptr, 0));
				if (opt == "--stored-len")
					c.stored_len = v;
				else if (opt == "--encoding")
					c.encoding = static_cast<cuda_criu::ChunkEncoding>(v);
				else if (opt == "--len")
					c.len = v;
				else {
					std::fprintf(stderr, "unknown option %s\n", opt.c_str());
					return 2;
				}
			}
			if (auto st = cuda_criu::write_gpu_index(dir, **idx); !st) {
				std::fprintf(stderr, "%s\n", st.error().message().c_str());
				return 1;
			}
			std::printf("%s %llu %#llx\n", (*idx)->files[c.file].name.c_str(), static_cast<unsigned long long>(c.offset),
				    static_cast<unsigned long long>(c.addr));
			return 0;
		}
	std::fprintf(stderr, "%s: no compressed chunk\n", argv[1]);
	return 1;
}
