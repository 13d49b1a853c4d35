// A file in memory that the plugin fills and CRIU maps into a restored process (criu_restore_map_fd,
// criu-patches/0008): where compressed GPU state is decoded while CRIU restores. On huge pages (a tmpfs of
// its own, mounted nowhere) where the kernel allows it, else a memfd; either way it shows in the process's
// maps as NAME (deleted).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "base/result.h"
#include "os/maps.h"
#include "os/unique_fd.h"

namespace cuda_criu {

class MemFile {
public:
	// A file of `bytes` bytes, all zero, that takes memory only where written.
	static Result<MemFile> create(const std::string &name, uint64_t bytes);
	// One another restore created, opened as fd (os/decoded_share.h): its size must be bytes.
	static Result<MemFile> adopt(UniqueFd fd, uint64_t bytes, bool huge);

	int fd() const { return fd_.get(); }
	uint64_t bytes() const { return bytes_; }
	bool huge() const { return huge_; } // on 2 MiB pages (a tmpfs of its own), not a memfd
	// Whether a line of /proc/PID/maps maps this file.
	bool is(const Mapping &m) const;

	// Where it is mapped shared for writing (nullptr before map()); map() again does nothing.
	uint8_t *data() const { return data_; }
	Status map();
	void unmap();

	// Gives its memory back (truncates it): call once no process maps it any more, since a page
	// mapped from it and not written since would then be gone from under that process.
	void free_memory();

	MemFile() = default;
	MemFile(MemFile &&other) noexcept;
	MemFile &operator=(MemFile &&other) noexcept;
	MemFile(const MemFile &) = delete;
	MemFile &operator=(const MemFile &) = delete;
	~MemFile() { unmap(); }

private:
	UniqueFd fd_;
	uint64_t bytes_ = 0;
	uint64_t inode_ = 0;
	dev_t dev_ = 0;
	bool huge_ = false;
	uint8_t *data_ = nullptr;
};

} // namespace cuda_criu
