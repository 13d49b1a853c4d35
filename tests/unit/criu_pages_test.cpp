// CRIU's pagemaps read by hand (image/criu_pages.h): what a restore with the plugin checks before CRIU
// reads any page, and what `cuda-criu inspect --verify` shows.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "image/criu_pages.h"

#include "temp_dir.h"

namespace cuda_criu {
namespace {

constexpr uint64_t kPage = 4096;

using Bytes = std::vector<uint8_t>;
using testing::TempDir;

Bytes bytes(const std::string &s) { return Bytes(s.begin(), s.end()); }

// pages_id 7; an entry without flags (present, as older CRIUs wrote them) of 2 pages at 0x1000 (at offset
// 14 of the file), one in the parent image (3 pages), a lazy one (1 page), a present one with nr_pages (1
// page at 0x30000, at offset 49). The same file as tests/e2e/cli_inspect.sh's.
Bytes sample_pagemap()
{
	return bytes(std::string("\x19\x43\x56\x54\x25\x40\x08\x56\x02\x00\x00\x00\x08\x07", 14) +
		     std::string("\x05\x00\x00\x00\x08\x80\x20\x10\x02", 9) +
		     std::string("\x08\x00\x00\x00\x08\x80\x80\x04\x10\x03\x18\x01", 12) +
		     std::string("\x0a\x00\x00\x00\x08\x80\x80\x08\x10\x00\x20\x02\x28\x01", 14) +
		     std::string("\x0a\x00\x00\x00\x08\x80\x80\x0c\x10\x00\x20\x04\x28\x01", 14));
}

TEST(CriuPages, DecodesPresentCompatParentAndLazyEntries)
{
	Bytes pm = sample_pagemap();
	auto r = decode_criu_pagemap(pm.data(), pm.size(), kPage);
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_EQ(r->pages_id, 7u);
	EXPECT_EQ(r->entries, 4u);
	ASSERT_EQ(r->present.size(), 2u);
	EXPECT_EQ(r->present[0].vaddr, 0x1000u);
	EXPECT_EQ(r->present[0].bytes, 2 * kPage);
	EXPECT_EQ(r->present[0].pages_offset, 0u);
	EXPECT_EQ(r->present[0].entry_offset, 14u);
	EXPECT_EQ(r->present[1].vaddr, 0x30000u);
	EXPECT_EQ(r->present[1].pages_offset, 2 * kPage);
	EXPECT_EQ(r->present[1].entry_offset, 49u);
	EXPECT_EQ(r->present_bytes, 3 * kPage);
	EXPECT_EQ(r->parent_bytes, 3 * kPage);
	EXPECT_EQ(r->lazy_bytes, kPage);
}

// Every length in the file is checked against the bytes at hand: a cut, a length past the end, a varint
// that never ends or a page count that overflows is an error, never a read past the buffer (ASan).
TEST(CriuPages, LengthsAreNeverTrusted)
{
	Bytes pm = sample_pagemap();
	for (size_t n = 0; n < pm.size(); n++) {
		Bytes cut(pm.begin(), pm.begin() + static_cast<long>(n));
		auto r = decode_criu_pagemap(cut.data(), cut.size(), kPage);
		// A cut between two messages is a shorter pagemap: only CRIU's sizes can tell (check_pages_files).
		if (n == 14 || n == 23 || n == 35 || n == 49)
			EXPECT_TRUE(r.ok()) << n << ": " << r.error().message();
		else
			EXPECT_FALSE(r.ok()) << "a pagemap cut at " << n << " bytes decoded";
	}
	Bytes huge = pm;
	huge.insert(huge.end(), {0xff, 0xff, 0xff, 0x7f, 0x08}); // a message of 2 GiB, 1 byte there
	auto r = decode_criu_pagemap(huge.data(), huge.size(), kPage);
	ASSERT_FALSE(r.ok());
	EXPECT_EQ(r.error().message(), "cut short at offset 63: a message of 2147483647 bytes, 1 left");

	Bytes endless = pm;
	endless.insert(endless.end(), {0x0b, 0, 0, 0, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
	r = decode_criu_pagemap(endless.data(), endless.size(), kPage);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("field 1: a malformed varint"), std::string::npos) << r.error().message();

	Bytes overflow = pm; // 2^62 pages at 0
	overflow.insert(overflow.end(), {0x0e, 0, 0, 0, 0x08, 0x00, 0x10, 0x00, 0x28, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
					 0x80, 0x80, 0x40});
	r = decode_criu_pagemap(overflow.data(), overflow.size(), kPage);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("a PagemapEntry of 4611686018427387904 pages"), std::string::npos)
		<< r.error().message();

	Bytes foreign = pm;
	foreign[4] ^= 1;
	r = decode_criu_pagemap(foreign.data(), foreign.size(), kPage);
	ASSERT_FALSE(r.ok());
	EXPECT_NE(r.error().message().find("not a CRIU pagemap image"), std::string::npos);
}

TEST(CriuPages, InventoryListsItsPlugins)
{
	// INVENTORY_MAGIC, then InventoryEntry {img_version = 2, plugins_entry {plugins = "cuda_plugin"}}
	Bytes inv = bytes(std::string("\x16\x31\x31\x58\x11\x00\x00\x00\x08\x02\x62\x0d\x62\x0b"
				      "cuda_plugin",
				      25));
	auto r = decode_criu_inventory(inv.data(), inv.size());
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_EQ(r->img_version, 2u);
	ASSERT_EQ(r->plugins.size(), 1u);
	EXPECT_EQ(r->plugins[0], "cuda_plugin");
	inv[11] = 0x0e; // plugins_entry one byte longer than its message
	EXPECT_FALSE(decode_criu_inventory(inv.data(), inv.size()).ok());
}

// Protobuf pieces for hand-made images (lengths below 128: one-byte varints).
std::string field_bytes(uint8_t number, const std::string &value)
{
	return std::string{static_cast<char>(number << 3 | 2), static_cast<char>(value.size())} + value;
}
std::string field_varint(uint8_t number, uint8_t value)
{
	return std::string{static_cast<char>(number << 3), static_cast<char>(value)};
}
std::string framed(const std::string &message)
{
	const size_t n = message.size();
	return std::string{static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
			   static_cast<char>(n >> 24)} +
	       message;
}
// A varint field of any value (addresses, flags past bit 6).
std::string field_u64(uint8_t number, uint64_t value)
{
	std::string s(1, static_cast<char>(number << 3));
	for (; value >= 0x80; value >>= 7)
		s += static_cast<char>(value | 0x80);
	return s + static_cast<char>(value);
}

// files.img: IMG_COMMON_MAGIC, FILES_MAGIC, then FileEntry messages; a REG entry's name and size are kept,
// the other types are passed over. A size of 0xff: none recorded.
struct FileEntrySpec {
	uint8_t type;
	std::string name;
	uint8_t size = 0xff;
};
Bytes files_image(const std::vector<FileEntrySpec> &entries)
{
	std::string img("\x19\x43\x56\x54\x38\x31\x30\x56", 8);
	uint8_t id = 1;
	for (const auto &[type, name, size] : entries) {
		std::string reg = field_varint(1, id) + field_varint(2, 0) + field_varint(3, 0) + field_bytes(5, "") +
				  field_bytes(6, name) + (size != 0xff ? field_varint(8, size) : "");
		img += framed(field_varint(1, type) + field_varint(2, id++) + (type == 1 ? field_bytes(3, reg) : ""));
	}
	return bytes(img);
}

TEST(CriuPages, FilesImageNamesTheRegularFiles)
{
	Bytes img = files_image({{1, "/usr/lib/libfoo.so.1", 100}, {2, ""}, {1, "/opt/model/weights.bin"}});
	auto r = decode_criu_reg_files(img.data(), img.size());
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_EQ(*r, (std::vector<CriuRegFile>{{"/usr/lib/libfoo.so.1", 100, 1},
						{"/opt/model/weights.bin", std::nullopt, 3}})); // the FileEntry ids
	std::vector<size_t> ends{8}; // where each message ends: a cut there is a shorter image
	for (size_t at = 8; at < img.size(); at += 4 + img[at])
		ends.push_back(at + 4 + img[at]);
	ASSERT_EQ(ends.size(), 4u);
	for (size_t n = 8; n < img.size(); n++) { // cut inside a message: an error, never a read past it
		Bytes cut(img.begin(), img.begin() + static_cast<long>(n));
		bool whole = std::find(ends.begin(), ends.end(), n) != ends.end();
		EXPECT_EQ(decode_criu_reg_files(cut.data(), cut.size()).ok(), whole) << "cut at " << n;
	}
	img[5] ^= 1;
	EXPECT_FALSE(decode_criu_reg_files(img.data(), img.size()).ok()) << "another image's magic";
}

TEST(CriuPages, FilesOfTheImageAreReadAheadWithoutOpeningAnythingButRegularFiles)
{
	TempDir dir;
	std::string file = dir.file("lib.so"), fifo = dir.file("fifo");
	ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
	dir.write("lib.so", bytes("\x7f" "ELF"));
	dir.write("other.so", Bytes(100, 1));
	// other.so's recorded size is not its size: another file than the one dumped (a container's, seen from
	// the host), passed by.
	dir.write("files.img", files_image({{1, fifo}, {1, file, 4}, {1, "relative/name"}, {1, dir.file("missing")},
					    {1, dir.file("other.so"), 99}}));
	auto files = criu_reg_files(dir.fd());
	ASSERT_TRUE(files.ok()) << files.error().message();
	ASSERT_EQ(files->size(), 5u);
	// Opened for reading, the FIFO would block this thread for good (no writer): the hint passes it by,
	// and reads the one regular file there is.
	for (unsigned threads : {4u, 1u}) {
		ReadAhead read = read_heads_ahead(*files, threads);
		EXPECT_EQ(read.files, 1u);
		EXPECT_EQ(read.bytes, 4u);
	}
	(*files)[4].size = std::nullopt; // no size recorded: read
	EXPECT_EQ(read_heads_ahead(*files, 2).bytes, 104u);
	std::atomic<bool> stop{true};
	EXPECT_EQ(read_heads_ahead(*files, 2, &stop).bytes, 0u);
	TempDir empty;
	auto none = criu_reg_files(empty.fd());
	ASSERT_TRUE(none.ok()) << none.error().message();
	EXPECT_TRUE(none->empty());
}

// VmaEntry.status bits (criu/include/image.h).
constexpr uint32_t kRegular = 1 << 0, kAnonPrivate = 1 << 9, kFilePrivate = 1 << 6, kFileShared = 1 << 7;
constexpr uint32_t kPrivateFile = kRegular | kFilePrivate;

// mm-N.img: IMG_COMMON_MAGIC, MM_MAGIC, then one MmEntry {mm_start_code = 1, vmas = 14 {start, end, pgoff,
// shmid, prot, flags, status, fd}}.
struct VmaSpec {
	uint64_t start, end, pgoff, shmid;
	uint32_t status;
};
std::string vma_entry(const VmaSpec &v)
{
	return field_u64(1, v.start) + field_u64(2, v.end) + field_u64(3, v.pgoff) + field_u64(4, v.shmid) +
	       field_u64(5, 3) + field_u64(6, 2) + field_u64(7, v.status) + field_u64(8, 0);
}
Bytes mm_image(const std::vector<VmaSpec> &vmas)
{
	std::string mm = field_u64(1, 0x400000);
	for (const VmaSpec &v : vmas)
		mm += field_bytes(14, vma_entry(v));
	return bytes(std::string("\x19\x43\x56\x54\x20\x28\x49\x57", 8) + framed(mm));
}

// pagemap-N.img: a PagemapHead {pages_id = 1}, then entries of `pages` pages: present (no flags) or in the
// parent image.
struct PagemapEntrySpec {
	uint64_t vaddr, pages;
	bool in_parent = false;
};
Bytes pagemap_image(const std::vector<PagemapEntrySpec> &entries)
{
	std::string pm = std::string("\x19\x43\x56\x54\x25\x40\x08\x56", 8) + framed(field_varint(1, 1));
	for (const auto &[vaddr, pages, in_parent] : entries)
		pm += framed(field_u64(1, vaddr) + field_u64(2, pages) + (in_parent ? field_varint(3, 1) : ""));
	return bytes(pm);
}

// Only what the restorer maps privately from a file of files.img and then writes its dumped pages over:
// not anonymous memory, a shared file mapping, or a private one CRIU restores from elsewhere.
TEST(CriuPages, MmImageKeepsOnlyPrivateFileMappings)
{
	Bytes mm = mm_image({{0x10000, 0x13000, 0x2000, 1, kPrivateFile},
			     {0x13000, 0x14000, 0, 0, kRegular | kAnonPrivate},
			     {0x14000, 0x15000, 0, 2, kRegular | kFileShared},
			     {0x15000, 0x16000, 0, 3, kFilePrivate}, // not a regular area
			     {0x16000, 0x17000, 0, 4, kPrivateFile | 1 << 10},
			     {0x17000, 0x18000, 0, 5, kPrivateFile | 1 << 11},
			     {0x18000, 0x19000, 0, 6, kPrivateFile | 1 << 13},
			     {0x19000, 0x1a000, 0, 7, kPrivateFile | 1 << 14},
			     {0x1a000, 0x1b000, 0, 8, kPrivateFile | 1 << 27},
			     {0x7f0000000000, 0x7f0000200000, 0x123000, 9, kPrivateFile}});
	auto r = decode_criu_private_file_vmas(mm.data(), mm.size());
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_EQ(*r, (std::vector<CriuFileVma>{{0x10000, 0x13000, 0x2000, 1},
						{0x7f0000000000, 0x7f0000200000, 0x123000, 9}}));

	// One message: a cut anywhere is an error, never a read past the buffer (ASan).
	for (size_t n = 0; n < mm.size(); n++) {
		Bytes cut(mm.begin(), mm.begin() + static_cast<long>(n));
		EXPECT_FALSE(decode_criu_private_file_vmas(cut.data(), cut.size()).ok()) << "cut at " << n;
	}
	auto error = [](const Bytes &img) {
		auto e = decode_criu_private_file_vmas(img.data(), img.size());
		return e.ok() ? std::string("decoded") : e.error().message();
	};
	auto has = [](const std::string &message, const char *part) { return message.find(part) != std::string::npos; };
	std::string e = error(mm_image({{0x10000, 0x11000, 0, 1, kPrivateFile}, {0x13000, 0x13000, 0, 1, kPrivateFile}}));
	EXPECT_TRUE(has(e, "VmaEntry 1: 0x13000-0x13000: it does not end past its start")) << e;
	e = error(mm_image({{0x12000, 0x11000, 0, 1, kRegular | kAnonPrivate}}));
	EXPECT_TRUE(has(e, "VmaEntry 0: 0x12000-0x11000: it does not end past its start")) << e;
	e = error(mm_image({{0x10000, 0x11000, UINT64_MAX - 0x800, 1, kPrivateFile}}));
	EXPECT_TRUE(has(e, "past 2^64 bytes")) << e;
	e = error(mm_image({{0x10000, 0x11000, 0, uint64_t(1) << 32, kPrivateFile}}));
	EXPECT_TRUE(has(e, "file id 4294967296")) << e;
	// Another mapping's offset and id are not a file's: taken as they are.
	EXPECT_EQ(error(mm_image({{0x10000, 0x11000, UINT64_MAX, uint64_t(1) << 40, kRegular | 1 << 10}})), "decoded");

	std::string magic("\x19\x43\x56\x54\x20\x28\x49\x57", 8);
	e = error(bytes(magic + framed(field_bytes(14, field_u64(1, 0x1000) + field_u64(2, 0x2000)))));
	EXPECT_TRUE(has(e, "VmaEntry 0: no start, end, pgoff, shmid or status")) << e;
	e = error(bytes(magic + framed(field_u64(14, 1))));
	EXPECT_TRUE(has(e, "MmEntry field 14 (vmas) of wire type 0")) << e;
	e = error(bytes(magic + framed(field_bytes(14, field_bytes(7, "x")))));
	EXPECT_TRUE(has(e, "VmaEntry 0: field 7 of wire type 2")) << e;
	e = error(bytes(magic + framed("") + framed("")));
	EXPECT_TRUE(has(e, "a second MmEntry")) << e;
	EXPECT_EQ(error(bytes(magic)), "cut short: no MmEntry after the magic words");
	Bytes foreign = mm;
	foreign[4] ^= 1;
	EXPECT_TRUE(has(error(foreign), "not a CRIU mm image")) << error(foreign);
}

// The file bytes under each task's dumped pages of its private file mappings: a present run across two
// VMAs splits at their border, pages of anonymous memory or of a file files.img does not name add
// nothing, and the ranges of one file (of any task, under any of its ids) merge.
TEST(CriuPages, CopyOnWriteRangesAreTheFileBytesUnderDumpedPages)
{
	TempDir d;
	// ids 1 (libc), 2 (not a regular file), 3 (libm) and 4 (libc again, opened by another task)
	d.write("files.img",
		files_image({{1, "/lib/libc.so", 100}, {2, ""}, {1, "/lib/libm.so"}, {1, "/lib/libc.so", 100}}));
	d.write("mm-7.img", mm_image({{0x40000, 0x42000, 0x3000, 3, kPrivateFile}, // out of order: sorted
				      {0x10000, 0x13000, 0x2000, 1, kPrivateFile},
				      {0x13000, 0x15000, 0x8000, 1, kPrivateFile},
				      {0x15000, 0x17000, 0, 0, kRegular | kAnonPrivate},
				      {0x20000, 0x22000, 0, 3, kPrivateFile | 1 << 14},
				      {0x30000, 0x31000, 0x1000, 9, kPrivateFile}, // no such file
				      {0x31000, 0x32000, 0, 2, kPrivateFile}}));   // not a regular file
	d.write("pagemap-7.img", pagemap_image({{0x12000, 2},                     // across the libc VMAs
						{0x15000, 1},                     // anonymous
						{0x10000, 1},                     // out of order
						{0x11000, 1},
						{0x20000, 2},                     // memfd
						{0x30000, 2},                     // no such file
						{0x40000, 1, true},               // in the parent image: not written
						{0x41000, 2}}));                  // past the libm VMA's end
	d.write("mm-9.img", mm_image({{0x10000, 0x11000, 0x5000, 4, kPrivateFile}}));
	d.write("pagemap-9.img", pagemap_image({{0x10000, 1}}));
	d.write("mm-8.img", mm_image({{0x10000, 0x11000, 0, 1, kPrivateFile}})); // no pagemap: nothing
	d.write("mm-x.img", bytes("not an mm image, not a task's name"));

	off_t before = lseek(d.fd(), 0, SEEK_CUR);
	auto r = cow_file_ranges(d.fd(), kPage);
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_EQ(*r, (std::vector<FileRange>{{"/lib/libc.so", 100, 0x2000, 0x4000},
					      {"/lib/libc.so", 100, 0x8000, 0x1000},
					      {"/lib/libm.so", std::nullopt, 0x4000, 0x1000}}));
	EXPECT_EQ(lseek(d.fd(), 0, SEEK_CUR), before); // CRIU's descriptor of the directory is left alone

	d.write("pagemap-9.img", bytes("not a pagemap"));
	auto bad = cow_file_ranges(d.fd(), kPage);
	ASSERT_FALSE(bad.ok());
	EXPECT_EQ(bad.error().message().rfind("pagemap-9.img: not a CRIU pagemap image", 0), 0u) << bad.error().message();
	d.write("pagemap-9.img", pagemap_image({{0x10000, 2}, {0x11000, 1}}));
	bad = cow_file_ranges(d.fd(), kPage);
	ASSERT_FALSE(bad.ok());
	EXPECT_EQ(bad.error().message(), "pagemap-9.img: the entries at 0x10000 and 0x11000 overlap");
	ASSERT_EQ(unlink(d.file("pagemap-9.img").c_str()), 0);
	d.write("mm-10.img", mm_image({{0x10000, 0x12000, 0, 1, kPrivateFile}, {0x11000, 0x13000, 0, 1, kPrivateFile}}));
	bad = cow_file_ranges(d.fd(), kPage);
	ASSERT_FALSE(bad.ok());
	EXPECT_EQ(bad.error().message(), "mm-10.img: the VMAs at 0x10000 and 0x11000 overlap");
	d.write("mm-10.img", bytes("not an mm image"));
	bad = cow_file_ranges(d.fd(), kPage);
	ASSERT_FALSE(bad.ok());
	EXPECT_EQ(bad.error().message().rfind("mm-10.img: not a CRIU mm image", 0), 0u) << bad.error().message();

	ASSERT_EQ(unlink(d.file("files.img").c_str()), 0); // nothing names the files: nothing to read
	auto none = cow_file_ranges(d.fd(), kPage);
	ASSERT_TRUE(none.ok()) << none.error().message();
	EXPECT_TRUE(none->empty());
}

// The ranges of the files there are, read into the page cache: not past the ranges, not a file whose size
// is not the recorded one, nothing but regular files opened.
TEST(CriuPages, CopyOnWriteRangesAreReadAhead)
{
	TempDir d;
	d.write("lib.so", Bytes(5 * kPage, 0x5a));
	d.write("other.so", Bytes(100, 1));
	std::string fifo = d.file("fifo");
	ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
	std::vector<FileRange> ranges{{fifo, std::nullopt, 0, kPage},
				      {d.file("lib.so"), 5 * kPage, kPage, 2 * kPage},
				      {d.file("lib.so"), 5 * kPage, 4 * kPage, 100},
				      {d.file("missing"), std::nullopt, 0, kPage},
				      {d.file("other.so"), 99, 0, 50}, // another file than the one dumped
				      {"relative/lib.so", std::nullopt, 0, kPage}};
	for (unsigned threads : {1u, 4u}) {
		ReadAhead read = read_ranges_ahead(ranges, threads);
		EXPECT_EQ(read.files, 1u) << threads << " thread(s)";
		EXPECT_EQ(read.bytes, 2 * kPage + 100) << threads << " thread(s)";
	}
	ranges[4].size = std::nullopt; // no size recorded: read
	EXPECT_EQ(read_ranges_ahead(ranges, 2).bytes, 2 * kPage + 150);
	std::atomic<bool> stop{true};
	EXPECT_EQ(read_ranges_ahead(ranges, 2, &stop).bytes, 0u);
	EXPECT_EQ(read_ranges_ahead({}, 4).files, 0u);
}

TEST(CriuPages, PagemapNames)
{
	EXPECT_TRUE(is_pagemap_name("pagemap-1.img"));
	EXPECT_TRUE(is_pagemap_name("pagemap-shmem-42.img"));
	EXPECT_FALSE(is_pagemap_name("pagemap-.img"));
	EXPECT_FALSE(is_pagemap_name("pagemap-1x.img"));
	EXPECT_FALSE(is_pagemap_name("pages-1.img"));
	EXPECT_FALSE(is_pagemap_name("pagemap-shmem-.img"));

	TempDir d;
	for (const char *n : {"pagemap-2.img", "pagemap-10.img", "pages-2.img", "pagemap-shmem-3.img", "core-1.img"})
		d.write(n, {});
	off_t before = lseek(d.fd(), 0, SEEK_CUR);
	auto names = pagemap_names(d.fd());
	ASSERT_TRUE(names.ok()) << names.error().message();
	EXPECT_EQ(*names, (std::vector<std::string>{"pagemap-10.img", "pagemap-2.img", "pagemap-shmem-3.img"}));
	EXPECT_EQ(lseek(d.fd(), 0, SEEK_CUR), before); // CRIU's descriptor of the directory is left alone
}

// CRIU's pages files read whole, in 2 MiB pieces over the threads; what cannot be read is passed by.
TEST(CriuPages, PagesFilesAreReadAheadWhole)
{
	TempDir d;
	d.write("pages-1.img", Bytes((5 << 20) + 3, 0x5a)); // three pieces, the last short
	d.write("pages-2.img", Bytes(kPage, 1));
	ASSERT_EQ(mkdirat(d.fd(), "pages-3.img", 0700), 0);
	for (unsigned threads : {1u, 3u, 16u}) {
		ReadAhead read = read_ahead(d.fd(), {"pages-1.img", "pages-2.img", "pages-3.img", "pages-9.img"}, threads);
		EXPECT_EQ(read.files, 2u) << threads << " thread(s)";
		EXPECT_EQ(read.bytes, (5u << 20) + 3 + kPage) << threads << " thread(s)";
	}
	std::atomic<bool> stop{true};
	EXPECT_EQ(read_ahead(d.fd(), {"pages-1.img"}, 2, &stop).bytes, 0u);
	EXPECT_EQ(read_ahead(d.fd(), {}, 4).files, 0u);
}

// The restore's check: a pages file shorter than its pagemap declares, or missing, refuses the restore
// by name; whole again, it passes.
TEST(CriuPages, AShortOrMissingPagesFileIsRefusedByName)
{
	TempDir d;
	d.write("pagemap-1.img", sample_pagemap());
	d.write("pages-7.img", Bytes(3 * kPage, 0x5a));
	auto ok = check_pages_files(d.fd(), kPage);
	ASSERT_TRUE(ok.ok()) << ok.error().message();
	EXPECT_EQ(ok->pagemaps, 1u);
	EXPECT_EQ(ok->bytes, 3 * kPage);
	EXPECT_EQ(ok->pages, std::vector<std::string>{"pages-7.img"}); // what the restore reads ahead
	EXPECT_TRUE(ok->unchecked.empty());

	d.resize("pages-7.img", 10000);
	auto cut = check_pages_files(d.fd(), kPage);
	ASSERT_FALSE(cut.ok());
	EXPECT_EQ(cut.error().message(), "pages-7.img is cut short: 10000 bytes, the image's pagemap declares 12288 "
					 "(the image was copied incompletely: copy it again)");
	auto f = read_pagemap_files(d.fd(), "pagemap-1.img", kPage);
	ASSERT_TRUE(f.ok());
	EXPECT_FALSE(f->pages_whole());
	ASSERT_NE(f->first_run_cut_off(), nullptr);
	EXPECT_EQ(f->first_run_cut_off()->vaddr, 0x30000u);

	ASSERT_EQ(unlink(d.file("pages-7.img").c_str()), 0);
	auto missing = check_pages_files(d.fd(), kPage);
	ASSERT_FALSE(missing.ok());
	EXPECT_EQ(missing.error().errno_value(), ENOENT);
	EXPECT_EQ(missing.error().message(), "pages-7.img is missing: the image's pagemap declares 12288 bytes in it "
					     "(the image was copied incompletely: copy it again)");

	d.write("pages-7.img", Bytes(3 * kPage + 1, 0)); // longer is fine: CRIU reads what the entries say
	EXPECT_TRUE(check_pages_files(d.fd(), kPage).ok());
	ASSERT_EQ(symlink(d.file("pages-7.img").c_str(), d.file("pages-8.img").c_str()), 0);
	Bytes through_link = sample_pagemap();
	through_link[13] = 8; // pages_id 8: a symbolic link, which CRIU follows
	d.write("pagemap-2.img", through_link);
	auto linked = check_pages_files(d.fd(), kPage);
	ASSERT_TRUE(linked.ok()) << linked.error().message();
	EXPECT_EQ(linked->pagemaps, 2u);
}

// Nothing to hold: a pagemap of parent and lazy pages only needs no pages file.
TEST(CriuPages, APagemapWithoutPresentPagesNeedsNoPagesFile)
{
	TempDir d;
	Bytes pm = sample_pagemap();
	pm.resize(35); // the head, the compat entry and the parent entry: cut after the parent's
	pm.erase(pm.begin() + 14, pm.begin() + 23);
	d.write("pagemap-1.img", pm);
	auto r = check_pages_files(d.fd(), kPage);
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_EQ(r->pagemaps, 1u);
	EXPECT_EQ(r->bytes, 0u);
}

// What this reader cannot take (a symbolic link, which the plugin never reads through; a format it does
// not know) is left to CRIU, which reads the pagemap itself, and listed; it does not refuse the restore.
TEST(CriuPages, APagemapItCannotReadIsLeftToCriu)
{
	TempDir d;
	d.write("real.img", sample_pagemap());
	ASSERT_EQ(symlink(d.file("real.img").c_str(), d.file("pagemap-1.img").c_str()), 0);
	d.write("pagemap-2.img", bytes("not a pagemap"));
	auto r = check_pages_files(d.fd(), kPage);
	ASSERT_TRUE(r.ok()) << r.error().message();
	EXPECT_EQ(r->pagemaps, 0u);
	ASSERT_EQ(r->unchecked.size(), 2u);
	EXPECT_EQ(r->unchecked[0], "pagemap-1.img is a symbolic link: refusing to follow it");
	EXPECT_NE(r->unchecked[1].find("pagemap-2.img: not a CRIU pagemap image"), std::string::npos) << r->unchecked[1];
}

} // namespace
} // namespace cuda_criu
