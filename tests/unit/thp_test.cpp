// Transparent huge page settings: the bracketed word of the sysfs files, and which mode applies to
// PMD-sized pages when the kernel has per-size controls.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "os/checkpoint_buffer.h"
#include "os/thp.h"
#include "temp_dir.h"

namespace cuda_criu {
namespace {

TEST(ThpChoice, TheBracketedWord)
{
	EXPECT_EQ(*parse_thp_choice("always [madvise] never\n"), "madvise");
	EXPECT_EQ(*parse_thp_choice("[always] madvise never\n"), "always");
	EXPECT_EQ(*parse_thp_choice("always madvise [never]"), "never");
	EXPECT_EQ(*parse_thp_choice("always defer [defer+madvise] madvise never\n"), "defer+madvise");
	EXPECT_EQ(*parse_thp_choice("always [inherit] madvise never\n"), "inherit");
	EXPECT_EQ(*parse_thp_choice("  [always]\tmadvise  never  \n"), "always");
}

TEST(ThpChoice, NoneOrSeveralOrMalformedIsAnError)
{
	for (const char *text : {"", "\n", "always madvise never\n", "[always] [madvise] never", "always [] never",
				 "always [madvise never", "always madvise] never", "[al]ways] never", "a[b] c"}) {
		auto r = parse_thp_choice(text);
		if (r) {
			ADD_FAILURE() << "'" << text << "' gave '" << *r << "'";
			continue;
		}
		EXPECT_EQ(r.error().errno_value(), EINVAL) << text;
	}
	// The text is quoted in the error, escaped.
	auto r = parse_thp_choice("always\x1b[2J madvise");
	ASSERT_FALSE(r);
	EXPECT_NE(r.error().message().find("\\x1b"), std::string::npos) << r.error().message();
}

struct FakeSysfs {
	testing::TempDir tmp;
	std::string dir = tmp.path();
	void write(const std::string &name, const std::string &text)
	{
		auto slash = name.rfind('/');
		if (slash != std::string::npos)
			mkdir((dir + "/" + name.substr(0, slash)).c_str(), 0755);
		std::ofstream(dir + "/" + name) << text;
	}
};

// A kernel before 6.8: no per-size controls; enabled is what applies.
TEST(ThpSettings, WithoutPerSizeControls)
{
	FakeSysfs fs;
	fs.write("enabled", "always madvise [never]\n");
	fs.write("defrag", "always defer defer+madvise [madvise] never\n");
	auto s = read_thp_settings(fs.dir);
	ASSERT_TRUE(s) << s.error().message();
	EXPECT_EQ(s->enabled, "never");
	EXPECT_EQ(s->defrag, "madvise");
	EXPECT_EQ(s->pmd_size_file, "");
	EXPECT_EQ(s->pmd_size_mode, "");
	EXPECT_EQ(s->pmd_mode, "never");
}

// The PMD size's control inherits by default, and overrides enabled otherwise (either way).
TEST(ThpSettings, PerSizeControlOfThePmdSize)
{
	FakeSysfs fs;
	fs.write("enabled", "always [madvise] never\n");
	fs.write("hpage_pmd_size", "2097152\n");
	fs.write("hugepages-2048kB/enabled", "always [inherit] madvise never\n");
	fs.write("hugepages-64kB/enabled", "[always] inherit madvise never\n"); // another size: no effect
	auto s = read_thp_settings(fs.dir);
	ASSERT_TRUE(s) << s.error().message();
	EXPECT_EQ(s->defrag, ""); // no defrag file
	EXPECT_EQ(s->pmd_size_file, fs.dir + "/hugepages-2048kB/enabled");
	EXPECT_EQ(s->pmd_size_mode, "inherit");
	EXPECT_EQ(s->pmd_mode, "madvise");

	fs.write("hugepages-2048kB/enabled", "[always] inherit madvise never\n");
	s = read_thp_settings(fs.dir);
	ASSERT_TRUE(s);
	EXPECT_EQ(s->enabled, "madvise");
	EXPECT_EQ(s->pmd_mode, "always");

	fs.write("enabled", "[always] madvise never\n");
	fs.write("hugepages-2048kB/enabled", "always inherit madvise [never]\n");
	s = read_thp_settings(fs.dir);
	ASSERT_TRUE(s);
	EXPECT_EQ(s->pmd_mode, "never");

	// arm64 with 64 KiB pages: 512 MiB PMDs.
	fs.write("hpage_pmd_size", "536870912\n");
	fs.write("hugepages-524288kB/enabled", "always [inherit] madvise never\n");
	s = read_thp_settings(fs.dir);
	ASSERT_TRUE(s);
	EXPECT_EQ(s->pmd_size_file, fs.dir + "/hugepages-524288kB/enabled");
	EXPECT_EQ(s->pmd_mode, "always");
}

// No THP in the kernel (no directory) and an unparsable file are errors naming the file.
TEST(ThpSettings, ErrorsNameTheFile)
{
	FakeSysfs fs;
	auto s = read_thp_settings(fs.dir + "/missing");
	ASSERT_FALSE(s);
	EXPECT_EQ(s.error().errno_value(), ENOENT);
	EXPECT_NE(s.error().message().find(fs.dir + "/missing/enabled"), std::string::npos) << s.error().message();

	fs.write("enabled", "always madvise never\n");
	s = read_thp_settings(fs.dir);
	ASSERT_FALSE(s);
	EXPECT_EQ(s.error().message(), fs.dir + "/enabled: no word in brackets in 'always madvise never'");
}

// This machine's files parse, whatever their modes.
TEST(ThpSettings, ThisMachine)
{
	struct stat st;
	if (stat((std::string(kThpSysfsDir) + "/enabled").c_str(), &st) != 0)
		GTEST_SKIP() << "this kernel has no transparent huge pages";
	auto s = read_thp_settings();
	ASSERT_TRUE(s) << s.error().message();
	EXPECT_TRUE(s->pmd_mode == "always" || s->pmd_mode == "madvise" || s->pmd_mode == "never") << s->pmd_mode;
}

// The three counters the populate's log line is made of, wherever /proc/vmstat lists them.
TEST(ThpCounters, FromVmstat)
{
	ThpCounters c = parse_thp_counters("nr_free_pages 123\ncompact_stall 7\ncompact_fail 2\nthp_fault_alloc 4096\n"
					   "thp_fault_fallback 12\nthp_fault_fallback_charge 0\n");
	EXPECT_EQ(c.faults, 4096U);
	EXPECT_EQ(c.fallbacks, 12U);
	EXPECT_EQ(c.compact_stalls, 7U);
	ThpCounters none = parse_thp_counters("nr_free_pages 1\n");
	EXPECT_EQ(none.faults + none.fallbacks + none.compact_stalls, 0U);
}

// This machine's: a huge page fault of this process's own moves thp_fault_alloc or thp_fault_fallback.
TEST(ThpCounters, ThisMachineCountsAHugePageFault)
{
	auto s = read_thp_settings();
	if (!s || s->pmd_mode == "never")
		GTEST_SKIP() << "no transparent huge pages for MADV_HUGEPAGE here";
	ThpCounters before = read_thp_counters();
	const size_t len = 4 * kHugePage;
	void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(m, MAP_FAILED);
	ASSERT_EQ(madvise(m, len, MADV_HUGEPAGE), 0);
	auto *p = static_cast<char *>(m);
	for (size_t off = 0; off < len; off += 4096)
		p[off] = 1;
	ThpCounters after = read_thp_counters();
	munmap(m, len);
	EXPECT_GT(after.faults + after.fallbacks, before.faults + before.fallbacks);
}

} // namespace
} // namespace cuda_criu
