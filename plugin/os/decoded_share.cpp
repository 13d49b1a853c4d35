#include "os/decoded_share.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/format.h"
#include "base/log.h"
#include "base/text.h"
#include "os/dir.h"
#include "os/proc.h"

namespace cuda_criu {

std::string format_decoded_record(const DecodedRecord &r)
{
	return format("%d %" PRIu64 " %d %" PRIu64 " %" PRIu64 " %" PRIu64 " %d %d\n", r.pid, r.start, r.fd, r.dev, r.ino,
		      r.bytes, r.huge ? 1 : 0, r.state);
}

std::optional<DecodedRecord> parse_decoded_record(std::string_view line)
{
	DecodedRecord r;
	int huge = 0, end = 0;
	std::string text(line);
	if (std::sscanf(text.c_str(), "%d %" SCNu64 " %d %" SCNu64 " %" SCNu64 " %" SCNu64 " %d %d\n%n", &r.pid, &r.start,
			&r.fd, &r.dev, &r.ino, &r.bytes, &huge, &r.state, &end) != 8 ||
	    static_cast<size_t>(end) != text.size() || r.pid <= 0 || r.fd < 0 || (huge != 0 && huge != 1) ||
	    r.state < DecodedRecord::kDecoding || r.state > DecodedRecord::kLeft)
		return std::nullopt;
	r.huge = huge == 1;
	return r;
}

namespace {

std::optional<DecodedRecord> read_record(int dir, const std::string &name)
{
	UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
	struct stat st {};
	char buf[256];
	if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
		return std::nullopt;
	ssize_t n = read(fd.get(), buf, sizeof(buf));
	if (n <= 0 || static_cast<size_t>(n) == sizeof(buf))
		return std::nullopt;
	return parse_decoded_record(std::string_view(buf, static_cast<size_t>(n)));
}

void write_record(int dir, const std::string &name, const DecodedRecord &r)
{
	std::string tmp = format("%s.%d.tmp", name.c_str(), getpid());
	std::string text = format_decoded_record(r);
	UniqueFd fd(openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
	if (!fd.valid() || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
	    renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) {
		LOG_DEBUG("cannot record %s for other restores: %s", name.c_str(), std::strerror(errno));
		(void)unlinkat(dir, tmp.c_str(), 0);
	}
}

// A descriptor of the directory of its own: a dup would share the ledger's flock, and hold it.
UniqueFd reopen_dir(int dir) { return UniqueFd(openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)); }

// The publisher still runs and holds the file it published at that descriptor (an exited one, even
// unreaped, holds none; a descriptor closed and reused holds another file).
bool publisher_alive(const DecodedRecord &r)
{
	struct stat st {};
	return r.pid != getpid() && start_time_of(r.pid) == r.start &&
	       stat(format("/proc/%d/fd/%d", r.pid, r.fd).c_str(), &st) == 0 && st.st_dev == r.dev && st.st_ino == r.ino;
}

// The file r publishes, opened through its publisher's descriptor, with the shared flock, whole.
Result<MemFile> open_published(const DecodedRecord &r)
{
	UniqueFd fd(open(format("/proc/%d/fd/%d", r.pid, r.fd).c_str(), O_RDWR | O_CLOEXEC));
	if (!fd.valid())
		return make_error(errno, "open /proc/%d/fd/%d: %s", r.pid, r.fd, std::strerror(errno));
	if (flock(fd.get(), LOCK_SH) != 0)
		return make_error(errno, "flock: %s", std::strerror(errno));
	struct stat st {};
	if (fstat(fd.get(), &st) != 0 || st.st_dev != r.dev || st.st_ino != r.ino ||
	    static_cast<uint64_t>(st.st_size) != r.bytes)
		return make_error(ESTALE, "/proc/%d/fd/%d is no longer the file published", r.pid, r.fd);
	return MemFile::adopt(std::move(fd), r.bytes, r.huge);
}

// Records whose publisher has ended (their restores are done), swept by the next restore that shares.
void sweep_records(int dir)
{
	auto d = Dir::open(".", dir);
	if (!d)
		return;
	std::vector<std::string> gone;
	while (const char *name = d->next()) {
		std::string_view n(name);
		if (!n.starts_with("decoded-") || n.ends_with(".tmp"))
			continue;
		if (auto r = read_record(dir, name); r && !publisher_alive(*r) && r->pid != getpid())
			gone.emplace_back(name);
	}
	for (const std::string &name : gone)
		(void)unlinkat(dir, name.c_str(), 0);
}

} // namespace

Result<std::pair<std::shared_ptr<MemFile>, std::shared_ptr<DecodedShare>>>
DecodedShare::open(const GpuLedgerPlace *place, const std::string &key, const std::string &name, uint64_t bytes)
{
	std::shared_ptr<MemFile> file;
	std::shared_ptr<DecodedShare> share;
	std::optional<Error> failed;
	auto create = [&]() -> bool {
		auto f = MemFile::create(name, bytes);
		if (!f) {
			failed = std::move(f).error();
			return false;
		}
		file = std::make_shared<MemFile>(std::move(*f));
		return true;
	};
	bool valid_key = !key.empty() && key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") ==
						   std::string::npos;
	if (place && valid_key)
		in_ledger_directory(*place, "decodes its GPU state alone", [&](int dir) {
			sweep_records(dir);
			std::string record_name = "decoded-" + key;
			if (auto r = read_record(dir, record_name);
			    r && r->bytes == bytes && (r->state == DecodedRecord::kDecoding || r->state == DecodedRecord::kDecoded) &&
			    publisher_alive(*r)) {
				auto f = open_published(*r);
				if (f) {
					file = std::make_shared<MemFile>(std::move(*f));
					share = std::make_shared<DecodedShare>(reopen_dir(dir), record_name, *r, file->fd(), true);
					return;
				}
				LOG_DEBUG("%s: not joined (%s)", record_name.c_str(), f.error().message().c_str());
			}
			if (!create())
				return;
			struct stat st {};
			if (flock(file->fd(), LOCK_SH) != 0 || fstat(file->fd(), &st) != 0)
				return; // decoded here alone
			DecodedRecord mine{getpid(), start_time_of(getpid()), file->fd(), st.st_dev, st.st_ino, bytes, file->huge(),
					   DecodedRecord::kDecoding};
			write_record(dir, record_name, mine);
			share = std::make_shared<DecodedShare>(reopen_dir(dir), record_name, mine, file->fd(), false);
		});
	if (!file && !failed)
		create();
	if (failed)
		return *failed;
	return std::make_pair(file, share);
}

std::optional<DecodedRecord> DecodedShare::read() const { return read_record(dir_.get(), name_); }

void DecodedShare::write(int state) const
{
	// Only while the record is still this restore's: another may have published anew since.
	if (auto r = read(); r && r->pid == record_.pid && r->start == record_.start && r->fd == record_.fd) {
		DecodedRecord w = record_;
		w.state = state;
		write_record(dir_.get(), name_, w);
	}
}

DecodedShare::~DecodedShare()
{
	if (!joined_ && !told_)
		write(DecodedRecord::kFailed); // never decoded here (the restore ended first): the others go on alone
}

void DecodedShare::tell(bool decoded)
{
	if (joined_)
		return;
	told_ = true;
	write(decoded ? DecodedRecord::kDecoded : DecodedRecord::kFailed);
}

bool DecodedShare::wait(const std::atomic<bool> &cancel)
{
	// A publisher that takes longer than this is not waited for: the file is decoded here too (the same
	// bytes into the same places).
	constexpr uint64_t kMaxWaitUs = 120'000'000;
	for (uint64_t deadline = now_us() + kMaxWaitUs; !cancel.load() && now_us() < deadline;) {
		auto r = read();
		if (!r || r->pid != record_.pid || r->start != record_.start || r->fd != record_.fd)
			return false; // published anew: its publisher went away
		if (r->state == DecodedRecord::kDecoded || r->state == DecodedRecord::kLeft)
			return true;
		if (r->state == DecodedRecord::kFailed || !publisher_alive(*r))
			return false;
		std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}
	return false;
}

bool DecodedShare::leave()
{
	if (left_)
		return false;
	left_ = true;
	if (!joined_)
		write(DecodedRecord::kLeft);
	(void)flock(file_fd_, LOCK_UN);
	return flock(file_fd_, LOCK_EX | LOCK_NB) == 0;
}

} // namespace cuda_criu
