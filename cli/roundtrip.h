// cuda-criu roundtrip: checkpoint and restore a user's own program through CRIU and our plugin, check
// that it is healthy afterwards, and report each step (a table, JSON, JUnit XML) for CI systems.
#pragma once

#include "cli.h"

namespace cuda_criu::cli {

// The round trip could not be tried: setup failed, or the program never became ready (nothing was
// checkpointed). 1 (kExitFailure) means a dump, a restore or a health check failed.
inline constexpr int kExitRoundtripNotRun = 3;

} // namespace cuda_criu::cli
