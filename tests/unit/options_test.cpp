#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/options.h"
#include "driver/driver.h"

namespace cuda_criu {
namespace {

std::map<std::string, std::string> no_file(std::map<std::string, std::string> env = {})
{
	env.emplace("CUDA_CRIU_CONFIG", "/dev/null");
	return env;
}

TEST(Options, Defaults)
{
	auto o = load_options(no_file());
	ASSERT_TRUE(o.ok()) << o.error().message();
	EXPECT_EQ(o->lock_timeout_ms, 10000u);
	EXPECT_EQ(o->parallel, 0u);
}

TEST(Options, EnvironmentValues)
{
	auto o = load_options(no_file({{"CUDA_CRIU_LOCK_TIMEOUT", "2.5"}, {"CUDA_CRIU_PARALLEL", "4"},
				       {"CUDA_CRIU_LIBCUDA", "/opt/libcuda.so.1"}}));
	ASSERT_TRUE(o.ok()) << o.error().message();
	EXPECT_EQ(o->lock_timeout_ms, 2500u);
	EXPECT_EQ(o->parallel, 4u);
	EXPECT_EQ(o->libcuda, "/opt/libcuda.so.1");
}

TEST(Options, BadValuesNameTheVariable)
{
	auto o = load_options(no_file({{"CUDA_CRIU_LOCK_TIMEOUT", "soon"}}));
	ASSERT_FALSE(o.ok());
	EXPECT_NE(o.error().message().find("CUDA_CRIU_LOCK_TIMEOUT"), std::string::npos) << o.error().message();
	EXPECT_FALSE(load_options(no_file({{"CUDA_CRIU_PARALLEL", "-1"}})).ok());
}

TEST(Options, ConfigFileWithUpstreamKeyFormAndEnvironmentOverride)
{
	char path[] = "/tmp/cuda-criu-conf-XXXXXX";
	int fd = mkstemp(path);
	ASSERT_GE(fd, 0);
	close(fd);
	std::ofstream(path) << "# comment\nlock-timeout = 3\ncuda.device-map=0=1\nparallel=2\n";
	auto o = load_options({{"CUDA_CRIU_CONFIG", path}, {"CUDA_CRIU_PARALLEL", "8"}});
	std::remove(path);
	ASSERT_TRUE(o.ok()) << o.error().message();
	EXPECT_EQ(o->lock_timeout_ms, 3000u);
	EXPECT_EQ(o->device_map.str(), "0=1");
	EXPECT_EQ(o->parallel, 8u);
}

TEST(Options, UnknownConfigKeyIsAnErrorWithLineNumber)
{
	char path[] = "/tmp/cuda-criu-conf-XXXXXX";
	int fd = mkstemp(path);
	close(fd);
	std::ofstream(path) << "lock-timeout=1\nlock-timeuot=2\n";
	auto o = load_options({{"CUDA_CRIU_CONFIG", path}});
	std::remove(path);
	ASSERT_FALSE(o.ok());
	EXPECT_NE(o.error().message().find(":2"), std::string::npos) << o.error().message();
}

TEST(Options, MissingExplicitConfigFileIsAnError)
{
	EXPECT_FALSE(load_options({{"CUDA_CRIU_CONFIG", "/nonexistent/cuda.conf"}}).ok());
}

TEST(Options, RelativeLibcudaIsRefused)
{
	auto o = load_options(no_file({{"CUDA_CRIU_LIBCUDA", "libcuda.so.1"}}));
	ASSERT_FALSE(o.ok());
	EXPECT_NE(o.error().message().find("not an absolute path"), std::string::npos) << o.error().message();
	EXPECT_NE(o.error().message().find("CUDA_CRIU_LIBCUDA"), std::string::npos) << o.error().message();
}

// A config file someone other than root or the caller can change could make root's CRIU load any library.
TEST(Options, ConfigFileWritableByOthersOrOwnedByAnotherUserIsRefused)
{
	char path[] = "/tmp/cuda-criu-conf-XXXXXX";
	close(mkstemp(path)); // mode 0600, owned by the caller: accepted
	std::ofstream(path) << "libcuda=/tmp/evil.so\n";
	ASSERT_TRUE(load_options({{"CUDA_CRIU_CONFIG", path}}).ok()) << path;

	chmod(path, 0666);
	auto o = load_options({{"CUDA_CRIU_CONFIG", path}});
	ASSERT_FALSE(o.ok());
	EXPECT_NE(o.error().message().find(path), std::string::npos) << o.error().message();
	EXPECT_NE(o.error().message().find("0666"), std::string::npos) << o.error().message();
	EXPECT_NE(o.error().message().find("chmod go-w"), std::string::npos) << o.error().message();
	chmod(path, 0620);
	EXPECT_FALSE(load_options({{"CUDA_CRIU_CONFIG", path}}).ok());

	chmod(path, 0644);
	if (geteuid() == 0 && chown(path, 4242, 4242) == 0) {
		o = load_options({{"CUDA_CRIU_CONFIG", path}});
		ASSERT_FALSE(o.ok());
		EXPECT_NE(o.error().message().find("uid 4242"), std::string::npos) << o.error().message();
		EXPECT_NE(o.error().message().find("chown root"), std::string::npos) << o.error().message();
	}
	std::remove(path);
}

TEST(Options, CompressionAndTheLedger)
{
	auto o = load_options(no_file());
	ASSERT_TRUE(o.ok());
	EXPECT_EQ(o->zstd_level, 0) << "compress is off by default";
	EXPECT_EQ(o->ledger, "/run/cuda-criu/gpu-reservations");
	EXPECT_EQ(o->ledger_timeout_ms, 5000u);
	for (const auto &[value, level] : std::vector<std::pair<std::string, int>>{{"zstd", 1}, {"zstd:3", 3}, {"zstd:19", 19}, {"off", 0}}) {
		auto c = load_options(no_file({{"CUDA_CRIU_COMPRESS", value}}));
		ASSERT_TRUE(c.ok()) << value << ": " << c.error().message();
		EXPECT_EQ(c->zstd_level, level) << value;
	}
	for (const std::string bad : {"lz4", "zstd:", "zstd:0", "zstd:20", "zstd:1x", "ZSTD", ""}) {
		auto c = load_options(no_file({{"CUDA_CRIU_COMPRESS", bad}}));
		ASSERT_FALSE(c.ok()) << bad;
		EXPECT_NE(c.error().message().find("CUDA_CRIU_COMPRESS"), std::string::npos) << c.error().message();
	}
	auto l = load_options(no_file({{"CUDA_CRIU_LEDGER", "/tmp/l/ledger"}, {"CUDA_CRIU_LEDGER_TIMEOUT", "0"}}));
	ASSERT_TRUE(l.ok()) << l.error().message();
	EXPECT_EQ(l->ledger, "/tmp/l/ledger");
	EXPECT_EQ(l->ledger_timeout_ms, 0u) << "0: one try, never forever";
	for (const auto &[key, bad] : std::vector<std::pair<std::string, std::string>>{
		     {"CUDA_CRIU_LEDGER", "relative/ledger"}, {"CUDA_CRIU_LEDGER", "/run/dir/"},
		     {"CUDA_CRIU_LEDGER_TIMEOUT", "61"}, {"CUDA_CRIU_LEDGER_TIMEOUT", "-1"}})
		EXPECT_FALSE(load_options(no_file({{key, bad}})).ok()) << key << "=" << bad;
}

TEST(GpuUuid, ParseAndPrint)
{
	auto u = GpuUuid::parse("GPU-01234567-89ab-cdef-0123-456789ABCDEF");
	ASSERT_TRUE(u.ok());
	EXPECT_EQ(u->str(), "GPU-01234567-89ab-cdef-0123-456789abcdef");
	EXPECT_FALSE(GpuUuid::parse("GPU-0123").ok());
	EXPECT_FALSE(GpuUuid::parse("GPU-0123456789abcdef0123456789abcdeg").ok());
}

TEST(Options, WriteWhileDumpingIsAutoByDefaultOrOff)
{
	auto o = load_options(no_file({}));
	ASSERT_TRUE(o.ok());
	EXPECT_TRUE(o->write_while_dumping);
	o = load_options(no_file({{"CUDA_CRIU_WRITE_WHILE_DUMPING", "off"}}));
	ASSERT_TRUE(o.ok());
	EXPECT_FALSE(o->write_while_dumping);
	o = load_options(no_file({{"CUDA_CRIU_WRITE_WHILE_DUMPING", "later"}}));
	ASSERT_FALSE(o.ok());
	EXPECT_NE(o.error().message().find("write-while-dumping: 'later' is neither auto nor off"), std::string::npos)
		<< o.error().message();
}

} // namespace
} // namespace cuda_criu
