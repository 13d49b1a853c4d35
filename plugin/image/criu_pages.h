// CRIU's own images, read by hand: the few fields that say whether each pages-N.img holds the bytes its
// pagemap declares (images/pagemap.proto and images/inventory.proto of CRIU 4.x, magic numbers from
// criu/include/magic.h). A pages file cut short hangs a stock CRIU's restore (its restorer retries a read
// that returns 0 at the end of the file forever) and, mapped, would end in SIGBUS: the plugin checks the
// sizes at restore, before CRIU reads any page, and `cuda-criu inspect --verify` shows them. The project
// does not build CRIU's .proto files for three messages of plain varints; every length is bounded by the
// bytes at hand, never trusted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"

namespace cuda_criu {

// The largest CRIU image read whole (a pagemap of tens of millions of entries).
inline constexpr size_t kCriuImageMaxBytes = size_t(1) << 30;

// An entry whose pages are in the pages image.
struct PagemapRun {
	uint64_t vaddr = 0;
	uint64_t bytes = 0;
	uint64_t pages_offset = 0; // where its pages begin in pages-<pages_id>.img
	uint64_t entry_offset = 0; // where the entry is in the pagemap file
};

struct CriuPagemap {
	uint32_t pages_id = 0;
	size_t entries = 0;
	std::vector<PagemapRun> present; // in the order of their pages in the pages image
	uint64_t present_bytes = 0;      // the bytes pages-<pages_id>.img must hold
	uint64_t parent_bytes = 0;       // in the parent image of an incremental dump (not in this directory)
	uint64_t lazy_bytes = 0;         // in no image: lazy migration serves them
};

// pagemap-N.img or pagemap-shmem-N.img: a PagemapHead {pages_id}, then PagemapEntry {vaddr,
// compat_nr_pages, in_parent, flags, nr_pages} messages, read as CRIU's init_compat_pagemap_entry()
// reads them (no flags: present; in_parent: in the parent). page_size: of the dumping machine.
Result<CriuPagemap> decode_criu_pagemap(const uint8_t *data, size_t size, uint64_t page_size);

struct CriuInventory {
	uint32_t img_version = 0;
	std::vector<std::string> plugins; // the plugins a restore needs (CRIU 4.0+ writes the list)
};

// inventory.img: its magic word, then one InventoryEntry {img_version = 1, plugins_entry = 12
// {plugins = 12}}.
Result<CriuInventory> decode_criu_inventory(const uint8_t *data, size_t size);

// A regular file the image's tasks have open or mapped.
struct CriuRegFile {
	std::string name;                // as CRIU stores it (from the root of their mount namespace)
	std::optional<uint64_t> size;    // its size at dump, where CRIU recorded it
	uint32_t id = 0;                 // FileEntry.id: what a file mapping's VmaEntry.shmid names
	bool operator==(const CriuRegFile &) const = default;
};

// files.img: FileEntry {type = 1, id = 2, reg = 3 {name = 6, size = 8}} messages: the regular files (REG).
Result<std::vector<CriuRegFile>> decode_criu_reg_files(const uint8_t *data, size_t size);

// decode_criu_reg_files of dir_fd's files.img (at most kCriuImageMaxBytes); none where there is no files.img.
Result<std::vector<CriuRegFile>> criu_reg_files(int dir_fd);

// A private mapping of a regular file (a library's .data): CRIU's restorer writes its dumped pages into it,
// and each write first reads the file's page (a copy-on-write fault).
struct CriuFileVma {
	uint64_t start = 0, end = 0;
	uint64_t pgoff = 0;   // the file offset of start, in bytes
	uint32_t file_id = 0; // VmaEntry.shmid: the file's id in files.img
	bool operator==(const CriuFileVma &) const = default;
};

// mm-N.img: its magic words, then one MmEntry {vmas = 14 {start = 1, end = 2, pgoff = 3, shmid = 4,
// status = 7}} (images/mm.proto, images/vma.proto): the VMAs CRIU maps privately from a regular file,
// in the image's order. Not those it restores otherwise (memfd, SysV IPC, socket, AIO ring, a plugin's).
Result<std::vector<CriuFileVma>> decode_criu_private_file_vmas(const uint8_t *data, size_t size);

// Bytes of a file, as files.img names it.
struct FileRange {
	std::string name;
	std::optional<uint64_t> size; // the file's size at dump, where CRIU recorded it
	uint64_t offset = 0, len = 0;
	bool operator==(const FileRange &) const = default;
};

// The bytes of the image's mapped files that lie under the dumped pages of its tasks' private file
// mappings (each mm-N.img's VMAs against pagemap-N.img's present pages): those the restorer's
// copy-on-write faults read. Sorted by file, then offset, the ranges of one file merged. A task without
// a pagemap, a file that files.img does not name and an image without files.img add nothing; a file that
// cannot be read or decoded is an error naming it. page_size: of the dumping machine.
Result<std::vector<FileRange>> cow_file_ranges(int dir_fd, uint64_t page_size);

// "pagemap-N.img" and "pagemap-shmem-N.img" (CRIU's CR_FD_PAGEMAP and CR_FD_SHMEM_PAGEMAP).
bool is_pagemap_name(const std::string &name);

// The pagemaps in the image directory dir_fd, sorted (read through a descriptor of its own: dir_fd's
// offset, which CRIU may share, is left alone).
Result<std::vector<std::string>> pagemap_names(int dir_fd);

// A pagemap and the pages file it names, as they are in the image directory.
struct PagemapFiles {
	std::string pagemap; // "pagemap-N.img"
	uint64_t pagemap_bytes = 0;
	CriuPagemap map;
	std::string pages;   // "pages-<pages_id>.img"
	int pages_errno = 0; // of its stat (ENOENT: missing); 0 when it was found
	bool pages_regular = false;
	uint64_t pages_size = 0;

	bool pages_whole() const { return pages_errno == 0 && pages_regular && pages_size >= map.present_bytes; }
	// The first run whose pages lie past the end of the pages file; nullptr when there is none.
	const PagemapRun *first_run_cut_off() const;
};

// Reads the pagemap name in dir_fd (never through a symbolic link, at most kCriuImageMaxBytes) and stats
// the pages file it names (through a symbolic link, as CRIU opens it). An error: the pagemap cannot be
// read or decoded.
Result<PagemapFiles> read_pagemap_files(int dir_fd, const std::string &name, uint64_t page_size);

// The bytes [addr, addr + len) of a task's memory as its pagemap and pages file (pages_fd, opened by the
// caller) hold them: zeros where no present entry covers them (memory never touched). Fails on a short
// read, naming the file and offset.
Status read_criu_memory(const PagemapFiles &files, int pages_fd, uint64_t addr, void *buf, size_t len);

struct PagesCheck {
	size_t pagemaps = 0;                // checked
	uint64_t bytes = 0;                 // the pages files' bytes they declare
	std::vector<std::string> pages;     // the pages files they name that hold bytes
	std::vector<std::string> unchecked; // pagemaps that could not be read, with the reason: left to CRIU
};

// The restore's check, before CRIU reads any page: every pages file that a pagemap of dir_fd names holds
// the bytes the pagemap declares. Fails on the first that is cut short, missing or not a regular file
// ("pages-1.img is cut short: X bytes, the image's pagemap declares Y (the image was copied
// incompletely: copy it again)"); a pagemap this reader cannot take is listed, not refused: CRIU reads
// it itself.
Result<PagesCheck> check_pages_files(int dir_fd, uint64_t page_size);

// What a read-ahead read: the files it opened and the bytes it read from them.
struct ReadAhead {
	size_t files = 0;
	uint64_t bytes = 0;
};

// Reads these files of dir_fd into the page cache now, with `threads` threads taking 2 MiB pieces in
// order, and returns once they are there (or stop is set): CRIU's restorer reads a pages file with one
// read after another, and on a cold page cache each waits behind every other reader of the disk (the GPU
// image's 15 at the same time: 0.3 GB/s where the disk gives 1.3). Read first, they come at the disk's
// pace, before the GPU image. Only a hint: a file that cannot be opened is left to CRIU.
ReadAhead read_ahead(int dir_fd, const std::vector<std::string> &names, unsigned threads,
		     const std::atomic<bool> *stop = nullptr);

// The first kHeadAheadBytes of at most kMaxHeadsAhead of these files (absolute paths, as seen from the
// plugin's root; kHeadsAheadBudget in all), read into the page cache with `threads` threads at once: CRIU
// opens each file a restored task maps, one after another, mapping its first MiB for the build-id check,
// and on a cold page cache each open waits for its directories, inode and first pages behind whatever else
// reads the disk (a PyTorch process maps ~100 libraries: 3.5-5.6 s of a cold restore on the GPU machine).
// Read here in parallel first, CRIU finds them cached. Only a hint: a file that cannot be opened (a
// container's own root, which CRIU joins later), or that is not on a local file system (os/file_pages.h:
// LocalMounts), is left to CRIU, and so is one whose size is not the one CRIU recorded (another file at
// that path: a container's files seen from the host).
inline constexpr size_t kMaxHeadsAhead = 4096;
// What CRIU's build-id check maps (BUILD_ID_MAP_SIZE). With only the first 128 KiB asked for (a WILLNEED),
// CRIU's opening of serve's mappings took 2.9 s of a cold restore (H100, 2026-12-06); with the whole MiB,
// 0.16 s (H200, 2026-12-05).
inline constexpr uint64_t kHeadAheadBytes = 1 << 20;
// At most this much of all heads together (serve's ~295 files: 120 MiB).
inline constexpr uint64_t kHeadsAheadBudget = 512 << 20;
ReadAhead read_heads_ahead(const std::vector<CriuRegFile> &files, unsigned threads,
			   const std::atomic<bool> *stop = nullptr);

// At most this much of all ranges together (read_ranges_ahead): the pages a restore will fault in
// anyway, but the hint runs before the GPU image and holds it back; a task whose private file
// mappings hold more than this (a huge .data written all over) has the rest read by its own faults.
inline constexpr uint64_t kRangesAheadBudget = uint64_t(1) << 30;

// These ranges of mapped files (cow_file_ranges; absolute paths, as seen from the plugin's root) read
// into the page cache with `threads` threads taking one file at a time: CRIU's restorer writes the dumped
// pages of each private file mapping, and on a cold page cache each write's copy-on-write fault reads its
// page from disk one at a time, behind the GPU image's readers. Read first, in parallel, the faults find
// them cached. Only a hint, passing by what read_heads_ahead passes by (a file that cannot be opened, one
// not on a local file system, one whose size is not the one CRIU recorded); kRangesAheadBudget in all.
ReadAhead read_ranges_ahead(const std::vector<FileRange> &ranges, unsigned threads,
			    const std::atomic<bool> *stop = nullptr);

} // namespace cuda_criu
