// Restores of one compressed GPU image running at once on a host (replicas started together) decode each
// process's GPU state once. The first of them publishes the memory file it decodes into (os/mem_file.h) in
// the GPU reservation ledger's directory (the restoring user's, 0700; os/gpu_ledger.h) as decoded-KEY, one
// line: "pid start fd dev ino bytes huge state". A restore that finds a live publisher's file of the same
// key opens that file through /proc/PID/fd/FD (root's, like CRIU), has CRIU map it into its process, and
// waits for the publisher's verdict instead of decoding; it decodes into the file itself where the
// publisher failed or went away. KEY names the image and the process, and a digest of every chunk's
// address, length, encoding and CRC-32C: equal keys, equal decoded bytes. Each restore holds a shared flock
// on the file while its process needs it; the last one to let go frees the memory.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "base/result.h"
#include "os/gpu_ledger.h"
#include "os/mem_file.h"
#include "os/unique_fd.h"

namespace cuda_criu {

struct DecodedRecord {
	enum State : int { kDecoding = 0, kDecoded = 1, kFailed = 2, kLeft = 3 }; // kLeft: decoded, not to join any more
	pid_t pid = 0;
	uint64_t start = 0; // the publisher's start time (os/proc.h)
	int fd = -1;
	uint64_t dev = 0, ino = 0, bytes = 0;
	bool huge = false;
	int state = kDecoding;
	bool operator==(const DecodedRecord &) const = default;
};

std::string format_decoded_record(const DecodedRecord &r);
std::optional<DecodedRecord> parse_decoded_record(std::string_view line);

class DecodedShare {
public:
	// The memory file for the process that key names (letters, digits, '-' and '.'), `bytes` long: one that
	// another restore published (joined()), else a new one (name: as MemFile::create), published for the
	// others where place allows (null: not shared).
	static Result<std::pair<std::shared_ptr<MemFile>, std::shared_ptr<DecodedShare>>>
	open(const GpuLedgerPlace *place, const std::string &key, const std::string &name, uint64_t bytes);

	bool joined() const { return joined_; }
	pid_t publisher() const { return record_.pid; }
	// Publisher: its decode is done (decoded) or failed; the restores that joined wait for this.
	void tell(bool decoded);
	// Joined: waits for the publisher's verdict; true once it has decoded the file, false when it failed,
	// went away, took more than 2 minutes, or cancel was set (then decode it yourself).
	bool wait(const std::atomic<bool> &cancel);
	// This restore's process no longer needs the file: no one joins any more (publisher); true when no
	// other restore holds it either (then free its memory).
	bool leave();

	DecodedShare(UniqueFd dir, std::string name, DecodedRecord record, int file_fd, bool joined)
		: dir_(std::move(dir)), name_(std::move(name)), record_(record), file_fd_(file_fd), joined_(joined)
	{
	}
	// A publisher that never told: its record says failed.
	~DecodedShare();
	DecodedShare(const DecodedShare &) = delete;
	DecodedShare &operator=(const DecodedShare &) = delete;

private:
	std::optional<DecodedRecord> read() const;
	void write(int state) const;

	UniqueFd dir_;      // the ledger's directory, checked when opened
	std::string name_;  // decoded-KEY
	DecodedRecord record_;
	int file_fd_ = -1;  // the memory file as this restore opened it (its MemFile's), with the shared flock
	bool joined_ = false;
	bool told_ = false;
	bool left_ = false;
};

} // namespace cuda_criu
