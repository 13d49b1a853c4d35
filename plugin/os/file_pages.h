// The pages of files a process has mapped and uses (its libraries' code and data, its data files): noted
// at dump, read ahead at restore while the driver restores the GPU state, when the disk has nothing else
// to do. A restore from a cold page cache then runs its first work from memory instead of waiting for the
// disk page by page (each fault reads one read-around window, in turn).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/memory_range.h"
#include "base/result.h"
#include "os/maps.h"
#include "os/unique_fd.h"

namespace cuda_criu {

// Runs of mapped file pages among n consecutive /proc/PID/pagemap entries, the first for address start.
std::vector<MemoryRange> file_page_runs(const uint64_t *entries, size_t n, uint64_t start, uint64_t page_size);

// Sorted ranges with gaps of at most gap bytes merged, the gap doubled until at most max_ranges remain
// (reading a small gap costs less than another request).
std::vector<MemoryRange> coalesce_ranges(std::vector<MemoryRange> ranges, uint64_t gap, size_t max_ranges);

// The pages of pid's mappings of regular files that are mapped in it now (its working set of them), in
// at most max_ranges ranges of its address space, sorted. Only files on local mounts (LocalMounts).
Result<std::vector<MemoryRange>> mapped_file_pages(pid_t pid, const std::vector<Mapping> &maps, size_t max_ranges);

// Whether the file at path is one of the NVIDIA driver's libraries (libcuda.so*, libnvidia-*): the code
// its threads run, the restore thread among them.
bool is_driver_library(const std::string &path);
// Asks the kernel to read ahead the file pages behind these ranges of pid's address space (as its memory
// map shows them now), at most max_bytes, until stop is set; returns the bytes asked for. Only regular
// files are opened; the driver's libraries are asked for first.
uint64_t read_file_pages_ahead(pid_t pid, const std::vector<MemoryRange> &ranges, uint64_t max_bytes,
			       const std::atomic<bool> &stop);

// The mounts of local file systems that a read-ahead may touch, by mount id, as /proc/PID/mountinfo
// lists them (0: this process's): block-device file systems and overlays (ext4, xfs, btrfs, overlay, ...).
// Not FUSE, NFS or other network file systems, whose open, attributes and reads go to a server or a
// daemon that may be one of the very processes CRIU holds stopped; not tmpfs, already in memory.
class LocalMounts {
public:
	explicit LocalMounts(pid_t pid = 0);
	bool has(uint64_t mnt_id) const;

private:
	std::vector<uint64_t> ids_; // sorted
};

// The regular file at path, on one of `local`'s mounts, opened for reading; else an invalid fd. Nothing
// else is opened (a device's open alone can act): the file is first opened with O_PATH, which opens
// nothing, asked for its type and mount without a round trip to any server (AT_STATX_DONT_SYNC), and
// reopened through it. size: its size, where given.
UniqueFd open_regular_file(const char *path, const LocalMounts &local, uint64_t *size = nullptr);

// POSIX_FADV_WILLNEED over [offset, offset + len) in pieces: one call reads at most the larger of the
// device's read-ahead window (read_ahead_kb: 128 KiB by default) and its largest request.
// Returns the bytes asked for: fewer where stop (if given) was set meanwhile.
uint64_t ask_to_read_ahead(int fd, uint64_t offset, uint64_t len, const std::atomic<bool> *stop = nullptr);

// Reads [offset, offset + len) of fd through the page cache and waits for it (buffered reads into buf, the
// bytes thrown away), until stop (if given) is set: unlike a WILLNEED, whose reads may still be queued on
// the disk behind everything asked meanwhile, the pages are in memory when it returns. A file that ends
// sooner ends the read. Returns the bytes read.
uint64_t read_into_cache(int fd, uint64_t offset, uint64_t len, std::vector<uint8_t> &buf,
			 const std::atomic<bool> *stop = nullptr);

} // namespace cuda_criu
