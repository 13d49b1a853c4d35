#include "roundtrip/probes.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/format.h"
#include "os/unique_fd.h"
#include "roundtrip/logs.h"

namespace cuda_criu::cli::roundtrip {
namespace {

// Waits up to a second for the peer to close its side of fd, reading what it sends.
void drain_until_closed(int fd)
{
	auto deadline = deadline_in(1000);
	for (long left = 1000; left > 0; left = ms_left(deadline)) {
		pollfd p{fd, POLLIN, 0};
		if (poll(&p, 1, static_cast<int>(left)) <= 0)
			break;
		char buf[4096];
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			break;
	}
}

} // namespace

bool port_accepts(uint16_t port)
{
	UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
	if (!fd.valid())
		return false;
	sockaddr_in addr = {};
	addr.sin_family = AF_INET;
	addr.sin_port = htons(port);
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd.get(), reinterpret_cast<const sockaddr *>(&addr), sizeof(addr)) != 0) {
		if (errno != EINPROGRESS)
			return false;
		pollfd p{fd.get(), POLLOUT, 0};
		if (poll(&p, 1, 1000) != 1)
			return false;
		int err = 0;
		socklen_t len = sizeof(err);
		if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
			return false;
	}
	shutdown(fd.get(), SHUT_WR);
	drain_until_closed(fd.get());
	return true;
}

Result<Regex> Regex::compile(const std::string &pattern)
{
	auto re = std::make_unique<regex_t>();
	if (int rc = regcomp(re.get(), pattern.c_str(), REG_EXTENDED | REG_NOSUB); rc != 0) {
		char msg[256];
		regerror(rc, re.get(), msg, sizeof(msg));
		return make_error(EINVAL, "'%s' is not a regular expression: %s", pattern.c_str(), msg);
	}
	// Compiled: from here on regfree() is owed.
	return Regex(std::unique_ptr<regex_t, Free>(re.release()));
}

void Regex::Free::operator()(regex_t *re) const
{
	regfree(re);
	delete re;
}

Result<ReadyProbe> ReadyProbe::create(ReadySpec spec, std::string program_log)
{
	std::shared_ptr<const Regex> re;
	if (spec.kind == ReadyKind::Log) {
		auto compiled = Regex::compile(spec.log_pattern);
		if (!compiled)
			return std::move(compiled).error();
		re = std::make_shared<const Regex>(std::move(*compiled));
	}
	return ReadyProbe(std::move(spec), std::move(program_log), std::move(re));
}

Baseline ReadyProbe::baseline() const
{
	Baseline b;
	b.when = Clock::now();
	struct stat st = {};
	if (spec_.kind == ReadyKind::File && stat(spec_.file.c_str(), &st) == 0) {
		b.file_existed = true;
		b.mtime = st.st_mtim;
		b.inode = st.st_ino;
	}
	if (spec_.kind == ReadyKind::Log && stat(program_log_.c_str(), &st) == 0)
		b.log_offset = st.st_size;
	return b;
}

bool ReadyProbe::met(Baseline &b, std::string &what) const
{
	switch (spec_.kind) {
	case ReadyKind::File:
		return file_changed(b, what);
	case ReadyKind::Log:
		return log_matches(b, what);
	case ReadyKind::Port:
		if (!port_accepts(spec_.port))
			return false;
		what = format("127.0.0.1:%u accepts connections", spec_.port);
		return true;
	case ReadyKind::Delay:
		if (seconds_since(b.when) * 1000 < spec_.delay_ms)
			return false;
		what = format("still running after %g s", spec_.delay_ms / 1000.0);
		return true;
	case ReadyKind::None:
		break;
	}
	return false;
}

std::string ReadyProbe::not_met(const Baseline &b) const
{
	switch (spec_.kind) {
	case ReadyKind::File:
		return spec_.file + (b.file_existed ? " was not modified" : " did not appear");
	case ReadyKind::Log:
		return "no new line of its output matched '" + spec_.log_pattern + "'";
	case ReadyKind::Port:
		return format("127.0.0.1:%u accepted no connection", spec_.port);
	case ReadyKind::Delay:
	case ReadyKind::None:
		break;
	}
	return "it did not get ready";
}

bool ReadyProbe::file_changed(const Baseline &b, std::string &what) const
{
	struct stat st = {};
	if (stat(spec_.file.c_str(), &st) != 0)
		return false;
	if (!b.file_existed) {
		what = spec_.file + " appeared";
		return true;
	}
	if (st.st_ino != b.inode || st.st_mtim.tv_sec != b.mtime.tv_sec || st.st_mtim.tv_nsec != b.mtime.tv_nsec) {
		what = spec_.file + " was modified";
		return true;
	}
	return false;
}

// Reads what the program wrote since b.log_offset and matches each line (and a started one).
bool ReadyProbe::log_matches(Baseline &b, std::string &what) const
{
	UniqueFd fd(open(program_log_.c_str(), O_RDONLY | O_CLOEXEC));
	if (!fd.valid())
		return false;
	char buf[65536];
	ssize_t n = 0;
	while ((n = pread(fd.get(), buf, sizeof(buf), b.log_offset)) > 0) {
		b.log_offset += n;
		b.pending.append(buf, static_cast<size_t>(n));
		size_t nl = 0;
		while ((nl = b.pending.find('\n')) != std::string::npos) {
			std::string line = b.pending.substr(0, nl);
			b.pending.erase(0, nl + 1);
			if (re_->matches(line)) {
				what = "its output matched: " + clean_line(line);
				return true;
			}
		}
		// A line that never ends must not grow without bound.
		if (b.pending.size() > (1 << 20))
			b.pending.erase(0, b.pending.size() - 4096);
	}
	if (!b.pending.empty() && re_->matches(b.pending)) {
		what = "its output matched: " + clean_line(b.pending);
		b.pending.clear();
		return true;
	}
	return false;
}

} // namespace cuda_criu::cli::roundtrip
