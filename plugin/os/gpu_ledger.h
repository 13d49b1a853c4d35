// A ledger of the GPU memory that restores in progress on this machine are about to take, shared by every
// CRIU on it: several restores started at once (replicas of one image) each see the GPUs' free memory
// before any of them has allocated, so each also subtracts what the others have reserved. A text file
// (one "owner start-time gpu-uuid bytes" line per reservation) under an exclusive flock; a reservation
// whose owner has exited counts no more.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/result.h"

namespace cuda_criu {

struct GpuReservation {
	pid_t owner = 0; // the restoring CRIU
	std::string gpu; // its UUID, "GPU-..."
	uint64_t bytes = 0;
};

// Gets the live reservations of other processes and returns this process's, which replace any it made
// before; an error leaves it with none.
using ReserveDecision = std::function<Result<std::vector<GpuReservation>>(const std::vector<GpuReservation> &others)>;

// Runs decide under the ledger's lock at path (its directory made if missing). Where the ledger cannot be
// used (no such directory and none can be made, not root), decide runs with no others and nothing is
// recorded: the check is then what it was without a ledger.
Status reserve_in_ledger(const std::string &path, const ReserveDecision &decide);

// Drops this process's reservations.
void release_in_ledger(const std::string &path);

// The ledger's lines, parsed; lines that do not parse are left out. (For tests.)
std::vector<std::pair<GpuReservation, uint64_t>> parse_ledger(const std::string &text);

} // namespace cuda_criu
