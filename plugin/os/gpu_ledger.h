// A ledger of the GPU memory that restores in progress on this machine are about to take, shared by every
// CRIU on it: several restores started at once (replicas of one image) each see the GPUs' free memory
// before any of them has allocated, so each also subtracts what the others have reserved. A text file,
// one "owner owner-start gpu-uuid bytes process" line per reservation, under an exclusive flock.
//
// The ledger must not be a way for another user to stall or mislead a restore: its directory is 0700 and
// the file 0600, both owned by the restoring user (root), checked with fstat on descriptors opened with
// O_NOFOLLOW; looser modes that this user owns (an older version's 0755/0644) are tightened. A ledger that
// cannot be trusted (another owner, a symlink, not a regular file, a line that does not parse) is not
// used, with one warning naming the file and the reason. The lock is taken without blocking, retried until
// a deadline; past it the restore goes on without the ledger, with a warning. Without the ledger the check
// is what it was without one: the GPUs' free memory alone.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/gpu.h"
#include "base/result.h"

namespace cuda_criu {

struct GpuReservation {
	pid_t owner = 0;          // the restoring CRIU
	uint64_t owner_start = 0; // its start time (os/proc.h): an entry whose owner is gone, or unreadable, counts no more
	GpuUuid gpu;
	uint64_t bytes = 0;
	pid_t process = 0; // the restored process it is for: its pid on this machine where the restore knows it,
	                   // else as the image numbers it; 0 for the whole restore
};

// Where the ledger is and how long to wait for its lock (the options ledger and ledger-timeout).
struct GpuLedgerPlace {
	std::string path;
	unsigned wait_ms = 0; // 0: one try
};

// What one restore holds in the ledger. Shared with the driver calls of its processes, which may outlive
// the restore (core/driver_calls.h): it owns everything it needs. Thread-safe.
class GpuReservations {
public:
	virtual ~GpuReservations() = default;
	// process's restore has returned: what it allocated shows in the GPUs' free memory from now on, so its
	// reservations end.
	virtual void settle(pid_t process) = 0;
	// Every reservation of this restore ends.
	virtual void release() = 0;
};

// Gets the live reservations of other restores and returns this restore's (owner fields are filled in
// by the ledger); an error leaves it with none. Runs under the ledger's lock: read the GPUs' free memory
// in it, so that no other restore's reservation comes or goes between that read and the decision.
using ReserveDecision = std::function<Result<std::vector<GpuReservation>>(const std::vector<GpuReservation> &others)>;

// Runs decide under the ledger's lock at place (its directory made if missing) and records what it
// returns. Where the ledger cannot be used (see above; also a non-root caller that cannot make its
// directory), decide runs with no others and nothing is recorded: the result is then null.
Result<std::shared_ptr<GpuReservations>> reserve_in_ledger(const GpuLedgerPlace &place, const ReserveDecision &decide);

// Runs fn with the ledger's directory (checked as above, made if missing) under the ledger's lock, for
// other records of restores in progress (os/decoded_share.h); false, without running it, where the ledger
// cannot be used. what: how the restore goes on without it, for the warnings ("goes on").
bool in_ledger_directory(const GpuLedgerPlace &place, const char *what, const std::function<void(int dir_fd)> &fn);

// The ledger's lines; nullopt when one does not parse. (For tests.)
std::optional<std::vector<GpuReservation>> parse_ledger(const std::string &text);

} // namespace cuda_criu
