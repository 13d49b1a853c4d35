// The --json output of the commands: a document built as a Json value (keys in the order they were set)
// and written by json_text().
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace cuda_criu::cli {

using Json = nlohmann::ordered_json;

// v indented two spaces, ending in a newline. Strings are escaped by the library, which writes bytes that
// are not valid UTF-8 (a process's command line may hold any) as U+FFFD, so that the output always parses.
// A double is written as "%.6g" writes it ("3", "0.333333", "1.5e+06"), null when it is not finite; the
// library's dump() would write "3.0", "0.3333333333333333" and "1500000.0".
std::string json_text(const Json &v);

} // namespace cuda_criu::cli
