// Runs the fuzz target over every file of the given directories, without libFuzzer (the normal g++
// build), so that the checked-in corpus is exercised on every test run. Files named "ok-*" must decode,
// files named "bad-*" must be refused; any other name only has to pass the target's own checks.
#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "image/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

namespace {

std::vector<std::string> list_dir(const std::string &dir)
{
	std::vector<std::string> names;
	DIR *d = opendir(dir.c_str());
	if (!d)
		return names;
	while (const dirent *e = readdir(d))
		if (e->d_name[0] != '.')
			names.emplace_back(e->d_name);
	closedir(d);
	std::sort(names.begin(), names.end());
	return names;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 2) {
		std::fprintf(stderr, "usage: %s CORPUS_DIR...\n", argv[0]);
		return 2;
	}
	int failures = 0;
	size_t files = 0;
	for (int a = 1; a < argc; a++) {
		std::vector<std::string> names = list_dir(argv[a]);
		if (names.empty()) {
			std::fprintf(stderr, "%s: no corpus files\n", argv[a]);
			return 2;
		}
		for (const std::string &name : names) {
			std::string path = std::string(argv[a]) + "/" + name;
			std::ifstream in(path, std::ios::binary);
			std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
			files++;
			LLVMFuzzerTestOneInput(data.data(), data.size());
			auto r = cuda_criu::decode_image(data.data(), data.size());
			bool want_ok = name.rfind("ok-", 0) == 0, want_bad = name.rfind("bad-", 0) == 0;
			if (want_ok && !r) {
				std::fprintf(stderr, "FAIL %s: refused: %s\n", path.c_str(), r.error().message().c_str());
				failures++;
			} else if (want_bad && r) {
				std::fprintf(stderr, "FAIL %s: accepted a malformed image\n", path.c_str());
				failures++;
			} else if (!r) {
				std::printf("%-28s refused: %s\n", name.c_str(), r.error().message().c_str());
			} else {
				std::printf("%-28s ok: %zu process(es), %zu GPU(s)\n", name.c_str(), r->processes.size(),
					    r->gpus.size());
			}
		}
	}
	std::printf("%zu file(s), %d failure(s)\n", files, failures);
	return failures ? 1 : 0;
}
