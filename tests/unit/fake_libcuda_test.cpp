// The fake libcuda of the end-to-end tests (tests/fakegpu) exports every entry point of the plugin's list
// (driver/cuda_api.h), and its variant without the checkpoint API lacks exactly that API.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include "driver/cuda_api.h"

namespace cuda_criu {
namespace {

void *open_library(const char *path)
{
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	EXPECT_NE(lib, nullptr) << path << ": " << dlerror();
	return lib;
}

TEST(FakeLibcuda, ExportsEveryEntryPoint)
{
	void *lib = open_library(CUDA_CRIU_FAKE_LIBCUDA);
	ASSERT_NE(lib, nullptr);
	for (EntryKind kind : {EntryKind::Basic, EntryKind::Checkpoint, EntryKind::Describe, EntryKind::Workload}) {
		CudaApi api;
		EXPECT_EQ(resolve_cuda_api(lib, api, kind), "") << "entry points of kind " << static_cast<int>(kind);
	}
	dlclose(lib);
}

TEST(FakeLibcuda, OldDriverLacksOnlyTheCheckpointApi)
{
	void *lib = open_library(CUDA_CRIU_FAKE_OLD_LIBCUDA);
	ASSERT_NE(lib, nullptr);
	CudaApi api;
	EXPECT_EQ(resolve_cuda_api(lib, api, EntryKind::Basic), "");
	EXPECT_EQ(resolve_cuda_api(lib, api, EntryKind::Checkpoint), entry_point_names(EntryKind::Checkpoint));
	dlclose(lib);
}

} // namespace
} // namespace cuda_criu
