#include "os/gpu_ledger.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "base/clock.h"
#include "base/format.h"
#include "base/log.h"
#include "os/proc.h"
#include "os/unique_fd.h"

namespace cuda_criu {

namespace {

constexpr size_t kMaxLedgerBytes = 1 << 20; // thousands of restores at once; more is not a ledger of ours

// The ledger's directory, checked and locked: the file is replaced whole (a new file renamed over it), so
// the lock is on the directory, which only its owner can open.
struct Locked {
	UniqueFd dir;
	std::string name; // the file's, in dir
};

// Why a ledger is not used: once per restore, as a warning when something there is not as this plugin
// leaves it (someone else's doing, or an older version's damage), at debug level when there is simply no
// ledger to be had (a restore that is not root).
void distrust(const std::string &path, const std::string &why)
{
	LOG_WARN("the GPU reservation ledger %s cannot be trusted (%s), so this restore does not use it: its GPU "
		 "memory check counts only the GPUs' free memory, not what restores in progress on this machine "
		 "are about to take. As root, remove it (rm -rf %s) and the next restore makes a new one",
		 path.c_str(), why.c_str(), path.c_str());
}

// Owner and mode of an open directory or file of the ledger: this user's, and no one else's to read or
// write; looser modes of this user's own (an older version made the directory 0755 and the file 0644)
// are tightened. An empty result: fine.
std::string check_owned(int fd, const std::string &path, bool is_dir)
{
	struct stat st {};
	if (fstat(fd, &st) != 0)
		return format("fstat %s: %s", path.c_str(), std::strerror(errno));
	if (is_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
		return format("%s is not a %s", path.c_str(), is_dir ? "directory" : "regular file");
	if (st.st_uid != geteuid())
		return format("%s is owned by uid %u, not by uid %u, which restores", path.c_str(),
			      static_cast<unsigned>(st.st_uid), static_cast<unsigned>(geteuid()));
	mode_t want = is_dir ? 0700 : 0600;
	if ((st.st_mode & 07777) != want) {
		if (fchmod(fd, want) != 0)
			return format("chmod %04o %s: %s", static_cast<unsigned>(want), path.c_str(), std::strerror(errno));
		LOG_INFO("the GPU reservation ledger's %s %s had mode %04o: now %04o", is_dir ? "directory" : "file",
			 path.c_str(), static_cast<unsigned>(st.st_mode & 07777), static_cast<unsigned>(want));
	}
	return "";
}

// Opens, checks and locks the ledger's directory (made if missing) within wait_ms. Invalid when the
// ledger is not to be used, after saying why.
Locked lock_ledger(const GpuLedgerPlace &place, const char *what)
{
	const std::string &path = place.path;
	size_t slash = path.rfind('/');
	if (path.empty() || path[0] != '/' || slash == 0 || slash + 1 == path.size()) {
		distrust(path, "not an absolute path of a file in a directory of its own");
		return {};
	}
	std::string dir = path.substr(0, slash);
	Locked l{UniqueFd(), path.substr(slash + 1)};
	if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
		LOG_DEBUG("no GPU reservation ledger (mkdir %s: %s)", dir.c_str(), std::strerror(errno));
		return {};
	}
	l.dir = UniqueFd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
	if (!l.dir.valid()) {
		struct stat st {};
		if ((errno == ELOOP || errno == ENOTDIR) && lstat(dir.c_str(), &st) == 0) // O_DIRECTORY says ENOTDIR for a link
			distrust(path, format("%s is %s", dir.c_str(), S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory"));
		else
			LOG_DEBUG("no GPU reservation ledger (%s: %s)", dir.c_str(), std::strerror(errno));
		return {};
	}
	if (std::string why = check_owned(l.dir.get(), dir, true); !why.empty()) {
		distrust(path, why);
		return {};
	}
	// Without blocking, retried: a lock someone holds for long costs this restore the deadline, no more.
	uint64_t deadline = now_us() + uint64_t{place.wait_ms} * 1000;
	while (flock(l.dir.get(), LOCK_EX | LOCK_NB) != 0) {
		if (errno != EWOULDBLOCK && errno != EINTR) {
			LOG_WARN("cannot lock the GPU reservation ledger's directory %s (%s): this restore %s without it",
				 dir.c_str(), std::strerror(errno), what);
			return {};
		}
		if (now_us() >= deadline) {
			LOG_WARN("the GPU reservation ledger %s stayed locked by another process for %s (ledger-timeout): "
				 "this restore %s without it; if no restore is in progress, find the holder with "
				 "'fuser -v %s'",
				 path.c_str(), format("%.1f s", place.wait_ms / 1000.0).c_str(), what, dir.c_str());
			return {};
		}
		std::this_thread::sleep_for(std::chrono::milliseconds(10));
	}
	return l;
}

// The entries of the locked ledger (none when it does not exist yet); nullopt when it cannot be trusted.
std::optional<std::vector<GpuReservation>> read_ledger(const Locked &l, const std::string &path)
{
	UniqueFd fd(openat(l.dir.get(), l.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
	if (!fd.valid()) {
		if (errno == ENOENT)
			return std::vector<GpuReservation>();
		distrust(path, errno == ELOOP ? "it is a symbolic link" : format("open: %s", std::strerror(errno)));
		return std::nullopt;
	}
	if (std::string why = check_owned(fd.get(), path, false); !why.empty()) {
		distrust(path, why);
		return std::nullopt;
	}
	std::string text;
	char buf[4096];
	ssize_t n;
	while ((n = read(fd.get(), buf, sizeof(buf))) > 0 && text.size() <= kMaxLedgerBytes)
		text.append(buf, static_cast<size_t>(n));
	if (n < 0 || text.size() > kMaxLedgerBytes) {
		distrust(path, n < 0 ? format("read: %s", std::strerror(errno)) : "larger than 1 MiB");
		return std::nullopt;
	}
	auto entries = parse_ledger(text);
	if (!entries)
		distrust(path, "a line of it is not \"owner owner-start gpu-uuid bytes process\"");
	return entries;
}

// Replaces the ledger's file by one holding entries: written beside it, then renamed over it, so that a
// restore killed meanwhile leaves the old file or the new one, never half of one.
void write_ledger(const Locked &l, const std::string &path, const std::vector<GpuReservation> &entries)
{
	std::string text;
	for (const GpuReservation &r : entries)
		text += format("%d %llu %s %llu %d\n", r.owner, static_cast<unsigned long long>(r.owner_start),
			       r.gpu.str().c_str(), static_cast<unsigned long long>(r.bytes), r.process);
	std::string tmp = format("%s.%d", l.name.c_str(), getpid());
	unlinkat(l.dir.get(), tmp.c_str(), 0);
	UniqueFd fd(openat(l.dir.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
	bool ok = fd.valid() && write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
		  renameat(l.dir.get(), tmp.c_str(), l.dir.get(), l.name.c_str()) == 0;
	if (!ok) {
		LOG_WARN("cannot update the GPU reservation ledger %s: %s", path.c_str(), std::strerror(errno));
		unlinkat(l.dir.get(), tmp.c_str(), 0);
	}
}

// An entry counts while its owner runs: the same pid with the start time it recorded. An owner whose
// start time could not be read (0) counts no more.
bool live(const GpuReservation &r)
{
	return r.owner > 0 && r.owner_start != 0 && start_time_of(r.owner) == r.owner_start;
}

class LedgerReservations final : public GpuReservations {
public:
	LedgerReservations(GpuLedgerPlace place, uint64_t start) : place_(std::move(place)), start_(start) {}
	~LedgerReservations() override { release(); }

	void settle(pid_t process) override
	{
		drop([process](const GpuReservation &r) { return r.process == process; });
	}
	void release() override
	{
		drop([](const GpuReservation &) { return true; });
	}

private:
	// Rewrites the ledger without this restore's entries that match, and without dead ones.
	void drop(const std::function<bool(const GpuReservation &)> &match)
	{
		std::lock_guard<std::mutex> g(mu_);
		if (done_)
			return;
		Locked l = lock_ledger(place_, "ends its reservations");
		auto entries = l.dir.valid() ? read_ledger(l, place_.path) : std::nullopt;
		if (!entries) { // said why; the entries end with this process (live())
			done_ = true;
			return;
		}
		std::vector<GpuReservation> kept;
		bool any_left = false;
		for (const GpuReservation &r : *entries) {
			bool mine = r.owner == getpid() && r.owner_start == start_;
			if (!live(r) || (mine && match(r)))
				continue;
			any_left = any_left || mine;
			kept.push_back(r);
		}
		write_ledger(l, place_.path, kept);
		done_ = !any_left;
	}

	GpuLedgerPlace place_;
	uint64_t start_;
	std::mutex mu_;
	bool done_ = false; // nothing of this restore is left in the ledger, or it cannot be used
};

} // namespace

std::optional<std::vector<GpuReservation>> parse_ledger(const std::string &text)
{
	std::vector<GpuReservation> out;
	std::istringstream in(text);
	std::string line;
	while (std::getline(in, line)) {
		std::istringstream fields(line);
		GpuReservation r;
		std::string gpu, rest;
		// An older version's lines have no process: they hold for its whole restore.
		if (!(fields >> r.owner >> r.owner_start >> gpu >> r.bytes) || r.owner <= 0)
			return std::nullopt;
		std::string process;
		if (fields >> process) {
			char *end = nullptr;
			long n = std::strtol(process.c_str(), &end, 10);
			if (*end != '\0' || n < 0 || n > INT32_MAX || fields >> rest)
				return std::nullopt;
			r.process = static_cast<pid_t>(n);
		}
		auto uuid = GpuUuid::parse(gpu);
		if (!uuid)
			return std::nullopt;
		r.gpu = *uuid;
		out.push_back(r);
	}
	return out;
}

bool in_ledger_directory(const GpuLedgerPlace &place, const char *what, const std::function<void(int dir_fd)> &fn)
{
	Locked l = lock_ledger(place, what);
	if (!l.dir.valid())
		return false;
	fn(l.dir.get());
	return true;
}

Result<std::shared_ptr<GpuReservations>> reserve_in_ledger(const GpuLedgerPlace &place, const ReserveDecision &decide)
{
	Locked l = lock_ledger(place, "goes on");
	auto entries = l.dir.valid() ? read_ledger(l, place.path) : std::nullopt;
	uint64_t start = start_time_of(getpid());
	if (!entries || start == 0) {
		auto mine = decide({});
		if (!mine)
			return std::move(mine).error();
		return std::shared_ptr<GpuReservations>();
	}
	// This process's own earlier entries (an earlier batch of its restore) are replaced.
	std::vector<GpuReservation> others;
	for (const GpuReservation &r : *entries)
		if (live(r) && !(r.owner == getpid() && r.owner_start == start))
			others.push_back(r);
	auto mine = decide(others);
	if (!mine) {
		write_ledger(l, place.path, others);
		return std::move(mine).error();
	}
	if (mine->empty()) {
		write_ledger(l, place.path, others);
		return std::shared_ptr<GpuReservations>();
	}
	std::vector<GpuReservation> all = others;
	for (GpuReservation &r : *mine) {
		r.owner = getpid();
		r.owner_start = start;
		all.push_back(r);
	}
	write_ledger(l, place.path, all);
	return std::shared_ptr<GpuReservations>(std::make_shared<LedgerReservations>(place, start));
}

} // namespace cuda_criu
