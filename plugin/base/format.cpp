#include "base/format.h"

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "base/result.h"

namespace cuda_criu {

std::string vformat(const char *fmt, va_list ap)
{
	va_list copy;
	va_copy(copy, ap);
	char small[256];
	int n = std::vsnprintf(small, sizeof(small), fmt, copy);
	va_end(copy);
	if (n < 0)
		return fmt;
	if (static_cast<size_t>(n) < sizeof(small))
		return std::string(small, n);
	std::string out(n, '\0');
	std::vsnprintf(out.data(), n + 1, fmt, ap);
	return out;
}

std::string format(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	std::string s = vformat(fmt, ap);
	va_end(ap);
	return s;
}

std::string errno_string(int errno_value)
{
	char buf[128];
	// GNU strerror_r returns a pointer that may or may not be buf.
	return strerror_r(errno_value, buf, sizeof(buf));
}

Error Error::context(const char *fmt, ...) &&
{
	va_list ap;
	va_start(ap, fmt);
	message_ = vformat(fmt, ap) + ": " + message_;
	va_end(ap);
	return std::move(*this);
}

Error make_error(int errno_value, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	std::string msg = vformat(fmt, ap);
	va_end(ap);
	return Error(errno_value, std::move(msg));
}

Error errno_error(const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	va_start(ap, fmt);
	std::string msg = vformat(fmt, ap);
	va_end(ap);
	return Error(saved, msg + ": " + errno_string(saved));
}

} // namespace cuda_criu
