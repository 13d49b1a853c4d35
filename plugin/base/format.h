// printf-style formatting into std::string (GCC 12 has no std::format), with compile-time checking.
#pragma once

#include <string>

namespace cuda_criu {

std::string vformat(const char *fmt, __builtin_va_list ap) __attribute__((format(printf, 1, 0)));
std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// strerror that is thread-safe and never returns null.
std::string errno_string(int errno_value);

} // namespace cuda_criu
