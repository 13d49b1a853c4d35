// cuda-criu check's runtime lines: the plugin directory CRIU 4.2 picks from its configuration files and
// environment, and runc's path in a containerd configuration.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "runtimes.h"

namespace cuda_criu::cli {
namespace {

namespace fs = std::filesystem;

class RuntimesTest : public ::testing::Test {
protected:
	void SetUp() override
	{
		char tmpl[] = "/tmp/cli-runtimes-test.XXXXXX";
		ASSERT_NE(mkdtemp(tmpl), nullptr);
		dir_ = tmpl;
		fs::create_directories(dir_ + "/etc");
		fs::create_directories(dir_ + "/home/.criu");
		setenv("CUDA_CRIU_CRIU_CONFIG_DIR", (dir_ + "/etc").c_str(), 1);
	}
	void TearDown() override
	{
		unsetenv("CUDA_CRIU_CRIU_CONFIG_DIR");
		fs::remove_all(dir_);
	}
	std::string write(const std::string &name, const std::string &text)
	{
		std::string path = dir_ + "/" + name;
		std::ofstream(path) << text;
		return path;
	}
	std::string dir_;
};

TEST_F(RuntimesTest, DefaultWithoutAnyLibdir)
{
	Libdir d = criu_libdir(CriuEnv{}, "");
	EXPECT_EQ(d.dir, "/usr/lib/criu");
	EXPECT_EQ(d.source, "CRIU's default, no libdir set");
}

TEST_F(RuntimesTest, LibsDirOnlyWhenNoFileSetsLibdir)
{
	CriuEnv env;
	env.libs_dir = "/from/env/";
	EXPECT_EQ(criu_libdir(env, "").dir, "/from/env");
	EXPECT_EQ(criu_libdir(env, "").source, "$CRIU_LIBS_DIR");
	write("etc/default.conf", "# comment\nlibdir=/from/default # trailing comment\n");
	EXPECT_EQ(criu_libdir(env, "").dir, "/from/default");
}

TEST_F(RuntimesTest, LaterFilesWinInCriusOrder)
{
	CriuEnv env;
	write("etc/default.conf", "libdir /a\n");
	env.home = dir_ + "/home";
	write("home/.criu/default.conf", "libdir /b\n");
	EXPECT_EQ(criu_libdir(env, "").dir, "/b");
	env.config_file = write("config.conf", "libdir /c\nlibdir /c2\n"); // the last line wins too
	EXPECT_EQ(criu_libdir(env, "").dir, "/c2");
	EXPECT_EQ(criu_libdir(env, "").source, "libdir in $CRIU_CONFIG_FILE " + env.config_file);
	std::string runc = write("etc/runc.conf", "timeout 40\nlibdir /d\n");
	Libdir d = criu_libdir(env, runc);
	EXPECT_EQ(d.dir, "/d");
	EXPECT_EQ(d.source, "libdir in " + runc);
	// A runtime file without libdir leaves the earlier one.
	EXPECT_EQ(criu_libdir(env, write("etc/crun.conf", "timeout 40\n")).dir, "/c2");
}

TEST_F(RuntimesTest, ContainerdRuncBinaryInEitherConfigVersion)
{
	EXPECT_EQ(containerd_runc_binary(dir_ + "/missing.toml"), "");
	EXPECT_EQ(containerd_runc_binary(write("v2.toml", R"(version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]
  BinaryName = "/usr/bin/crun"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  # BinaryName = "/commented/out"
  SystemdCgroup = true
  BinaryName = "/opt/runc/runc"
)")),
		  "/opt/runc/runc");
	EXPECT_EQ(containerd_runc_binary(write("v3.toml", R"(version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
BinaryName = '/usr/local/sbin/runc'
)")),
		  "/usr/local/sbin/runc");
	EXPECT_EQ(containerd_runc_binary(write("none.toml", "version = 2\n[plugins.x]\nBinaryName = \"/x\"\n")), "");
}

} // namespace
} // namespace cuda_criu::cli
