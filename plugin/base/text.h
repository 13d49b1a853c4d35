// Small text helpers shared by the plugin and the CLI.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"

namespace cuda_criu {

// "512.0 MiB", "3.2 GiB": sizes for people (one decimal; GiB from 1 GiB up).
std::string human_bytes(uint64_t bytes);

// text with every control character, DEL and non-ASCII byte written as \xNN (and '\' as \\): text from
// an image or another untrusted place must not reach CRIU's log or a terminal as escape sequences or
// fake log lines.
std::string printable(std::string_view text);

// text without the blanks (spaces, tabs, CR, LF) at either end.
std::string trim(std::string_view text);

// "2.5" -> 2500: seconds (a decimal number, 0 to 86400) as milliseconds; the error names the value.
Result<unsigned> parse_seconds(const std::string &value);

// The whole of a small file (procfs, sysfs, a config file), read through a descriptor opened
// O_CLOEXEC so that no child of CRIU inherits it; at most max_bytes (more is an EFBIG error). st, when
// given, gets fstat() of that same descriptor (no race between the check and the read).
Result<std::string> read_small_file(const std::string &path, size_t max_bytes = 1 << 20, struct stat *st = nullptr);

} // namespace cuda_criu
