// Where cuda-criu finds the criu and the plugin it came with: the places beside its own executable in the
// GPU bundle, the build tree and an installation, and which of them hold what is looked for.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "criu_info.h"
#include "temp_dir.h"

namespace cuda_criu::cli {
namespace {

namespace fs = std::filesystem;
using Places = std::vector<std::string>;

TEST(CompanionPlaces, BundleAndInstallLayouts)
{
	// The Debian package's CRIU (lib/cuda-criu/sbin/criu) first, then the bundle's: bin/cuda-criu, sbin/criu,
	// plugin/cuda_plugin.so; the build's CRIU_PLUGIN_DIR after it.
	EXPECT_EQ(companion_places(Companion::Criu, "/opt/b/bin/cuda-criu", "/usr/lib/criu"),
		  (Places{"/opt/b/lib/cuda-criu/sbin/criu", "/opt/b/sbin/criu"}));
	EXPECT_EQ(companion_places(Companion::PluginDir, "/opt/b/bin/cuda-criu", "/usr/lib/criu"),
		  (Places{"/opt/b/plugin", "/usr/lib/criu"}));
	// An installation with a CRIU_PLUGIN_DIR relative to its prefix, as install(DESTINATION) takes it.
	EXPECT_EQ(companion_places(Companion::PluginDir, "/usr/local/bin/cuda-criu", "lib/criu/"),
		  (Places{"/usr/local/plugin", "/usr/local/lib/criu"}));
	EXPECT_EQ(companion_places(Companion::PluginDir, "/usr/bin/cuda-criu", "/usr/lib64//criu/"),
		  (Places{"/usr/plugin", "/usr/lib64/criu"}));
	EXPECT_EQ(companion_places(Companion::PluginDir, "/opt/b/bin/cuda-criu", ""), Places{"/opt/b/plugin"});
	// The prefix is the root.
	EXPECT_EQ(companion_places(Companion::Criu, "/bin/cuda-criu", ""),
		  (Places{"/lib/cuda-criu/sbin/criu", "/sbin/criu"}));
}

TEST(CompanionPlaces, FoundOnlyWhereItIs)
{
	testing::TempDir t;
	const std::string exe = t.file("bin/cuda-criu");
	const std::string installed = t.file("lib/criu");
	fs::create_directories(t.file("bin"));
	fs::create_directories(t.file("sbin"));
	fs::create_directories(t.file("plugin"));
	fs::create_directories(installed);
	EXPECT_EQ(find_companion(Companion::Criu, exe, installed), "");
	EXPECT_EQ(find_companion(Companion::PluginDir, exe, installed), "");

	// A criu that cannot be run is not one; a plugin directory without cuda_plugin.so is not one.
	std::ofstream(t.file("sbin/criu")) << "#!/bin/sh\n";
	EXPECT_EQ(find_companion(Companion::Criu, exe, installed), "");
	ASSERT_EQ(chmod(t.file("sbin/criu").c_str(), 0755), 0);
	EXPECT_EQ(find_companion(Companion::Criu, exe, installed), t.file("sbin/criu"));
	// The package's CRIU before the one in PREFIX/sbin (a distribution's, too old for the plugin).
	fs::create_directories(t.file("lib/cuda-criu/sbin"));
	fs::copy_file(t.file("sbin/criu"), t.file("lib/cuda-criu/sbin/criu"));
	EXPECT_EQ(find_companion(Companion::Criu, exe, installed), t.file("lib/cuda-criu/sbin/criu"));
	std::ofstream(t.file("plugin/other.so")) << "x";
	fs::create_directories(t.file("plugin/cuda_plugin.so")); // a directory of that name
	EXPECT_EQ(find_companion(Companion::PluginDir, exe, installed), "");

	// The installed directory when the bundle's has none; the bundle's first when both do.
	std::ofstream(installed + "/cuda_plugin.so") << "x";
	EXPECT_EQ(find_companion(Companion::PluginDir, exe, installed), installed);
	fs::remove(t.file("plugin/cuda_plugin.so"));
	std::ofstream(t.file("plugin/cuda_plugin.so")) << "x";
	EXPECT_EQ(find_companion(Companion::PluginDir, exe, installed), t.file("plugin"));
}

} // namespace
} // namespace cuda_criu::cli
