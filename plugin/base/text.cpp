#include "base/text.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace cuda_criu {

std::string human_bytes(uint64_t bytes)
{
	if (bytes < (1ULL << 30))
		return format("%.1f MiB", static_cast<double>(bytes) / (1ULL << 20));
	return format("%.1f GiB", static_cast<double>(bytes) / (1ULL << 30));
}

std::string trim(std::string_view text)
{
	size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
	return b == std::string_view::npos ? std::string() : std::string(text.substr(b, e - b + 1));
}

std::string printable(std::string_view text)
{
	std::string out;
	out.reserve(text.size());
	for (char c : text) {
		auto u = static_cast<unsigned char>(c);
		if (u == '\\')
			out += "\\\\";
		else if (u < 0x20 || u >= 0x7f)
			out += format("\\x%02x", u);
		else
			out += c;
	}
	return out;
}

Result<unsigned> parse_seconds(const std::string &value)
{
	char *end = nullptr;
	double s = std::strtod(value.c_str(), &end);
	if (value.empty() || *end != '\0' || !std::isfinite(s) || s < 0 || s > 86400)
		return make_error(EINVAL, "'%s' is not a number of seconds (0 to 86400)", value.c_str());
	return static_cast<unsigned>(std::lround(s * 1000));
}

Result<std::string> read_small_file(const std::string &path, size_t max_bytes, struct stat *st)
{
	struct Fd {
		int fd;
		~Fd()
		{
			if (fd >= 0)
				close(fd);
		}
	} f{open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY)};
	if (f.fd < 0)
		return errno_error("open %s", path.c_str());
	if (st && fstat(f.fd, st) != 0)
		return errno_error("stat %s", path.c_str());
	std::string out;
	char buf[4096];
	for (;;) {
		ssize_t n = read(f.fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno_error("read %s", path.c_str());
		if (n == 0)
			return out;
		if (out.size() + static_cast<size_t>(n) > max_bytes)
			return make_error(EFBIG, "%s is larger than %zu bytes", path.c_str(), max_bytes);
		out.append(buf, static_cast<size_t>(n));
	}
}

} // namespace cuda_criu
