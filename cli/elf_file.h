// Read-only looks into binaries on disk: whether a program exports a symbol (CRIU built with our patch
// does), and whether a file holds a marker string (our plugin versus CRIU's own cuda_plugin.so).
#pragma once

#include <string>

#include "base/result.h"

namespace cuda_criu::cli {

// Whether the 64-bit ELF file at path defines symbol in its dynamic symbol table (.dynsym). Read with
// <elf.h> and bounds checks only; nothing is loaded or run.
Result<bool> elf_defines_dynamic_symbol(const std::string &path, const std::string &symbol);

// Whether the file at path contains the bytes of needle.
Result<bool> file_contains(const std::string &path, const std::string &needle);

} // namespace cuda_criu::cli
