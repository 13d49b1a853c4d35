// Sizes as the CLI prints them.
#pragma once

#include <cstdint>
#include <string>

#include "base/format.h"

namespace cuda_criu::cli {

// "32.0 MiB"
inline std::string mib(uint64_t bytes) { return format("%.1f MiB", static_cast<double>(bytes) / (1 << 20)); }

} // namespace cuda_criu::cli
