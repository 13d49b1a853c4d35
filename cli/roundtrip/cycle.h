// The round trip itself: set up, start the program and wait until it is ready, then per cycle dump it
// with CRIU, see it gone (or running on, with --leave-running, then killed), restore it and see it
// healthy again. Everything it starts and creates is removed at the end, also when it is interrupted.
#pragma once

#include "roundtrip/options.h"

namespace cuda_criu::cli::roundtrip {

class Client;

// Runs the round trip o describes for client (roundtrip/client.h), which shows it and returns the exit
// status.
int run_roundtrip(RoundtripOptions o, Client &client);
// cuda-criu roundtrip's: prints its table and writes its reports.
int run_roundtrip(const RoundtripOptions &o);

} // namespace cuda_criu::cli::roundtrip
