#include "core/lazy_decoded.h"

#include <poll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <system_error>

#include "base/log.h"

namespace cuda_criu {

LazyDecoded::~LazyDecoded()
{
	(void)finish();
}

void LazyDecoded::add(pid_t ns_pid, std::vector<MemoryRange> chunks)
{
	Process p;
	p.ns_pid = ns_pid;
	p.state.assign(chunks.size(), kPending);
	p.chunks = std::move(chunks);
	processes_.push_back(std::move(p));
}

bool LazyDecoded::has(pid_t ns_pid) const
{
	return std::any_of(processes_.begin(), processes_.end(), [&](const Process &p) { return p.ns_pid == ns_pid; });
}

LazyDecoded::Process *LazyDecoded::find(pid_t ns_pid)
{
	for (Process &p : processes_)
		if (p.ns_pid == ns_pid)
			return &p;
	return nullptr;
}

std::optional<size_t> LazyDecoded::chunk_at(const Process &p, uint64_t addr)
{
	auto it = std::upper_bound(p.chunks.begin(), p.chunks.end(), addr,
				   [](uint64_t a, const MemoryRange &c) { return a < c.start; });
	if (it == p.chunks.begin() || addr >= std::prev(it)->end)
		return std::nullopt;
	return static_cast<size_t>(std::prev(it) - p.chunks.begin());
}

void LazyDecoded::decoded(pid_t ns_pid, uint64_t addr)
{
	Process *p = find(ns_pid);
	std::optional<size_t> i = p ? chunk_at(*p, addr) : std::nullopt;
	if (!i)
		return;
	bool map;
	{
		std::lock_guard lock(mu_);
		p->state[*i] |= kDecoded;
		map = p->uffd && !ended_ && !(p->state[*i] & kMapped);
		if (map)
			p->state[*i] |= kMapped;
	}
	if (map)
		map_chunk(*p, *i);
}

std::optional<std::pair<pid_t, uint64_t>> LazyDecoded::wanted()
{
	std::lock_guard lock(mu_);
	if (wanted_.empty())
		return std::nullopt;
	auto w = wanted_.front();
	wanted_.pop_front();
	return w;
}

// A chunk marked mapped: mapped into its process from the decoded memory, whoever waits for it woken.
void LazyDecoded::map_chunk(Process &p, size_t i)
{
	const MemoryRange &c = p.chunks[i];
	Status st = p.uffd->map_from_file(c.start, c.end - c.start);
	if (st)
		return;
	{
		std::lock_guard lock(mu_);
		if (ended_) // the registration ended meanwhile: nothing waits
			return;
	}
	fail(std::move(st).error().context("pid %d (in the image): map its decoded GPU state on demand", p.ns_pid));
}

void LazyDecoded::fault(Process &p, uint64_t addr)
{
	std::optional<size_t> i = chunk_at(p, addr);
	if (!i) {
		fail(make_error(EFAULT, "pid %d (in the image): a fault at %#" PRIx64 " outside its decoded GPU state", p.ns_pid,
				addr));
		return;
	}
	uint8_t st;
	{
		std::lock_guard lock(mu_);
		p.faults++;
		st = p.state[*i];
		if ((st & kDecoded) && !(st & kMapped))
			p.state[*i] |= kMapped;
		if (!(st & kDecoded) && !(st & kWanted)) { // decoded next, mapped by decoded()
			p.state[*i] |= kWanted;
			wanted_.emplace_back(p.ns_pid, p.chunks[*i].start);
			p.waited++;
		}
	}
	if (st & kMapped) // mapped since the fault was raised
		(void)p.uffd->wake(p.chunks[*i].start, p.chunks[*i].end - p.chunks[*i].start);
	else if (st & kDecoded)
		map_chunk(p, *i);
}

// Maps a few chunks decoded before the attach (in ascending order, as the driver reads them); true while
// some are left.
bool LazyDecoded::sweep_some()
{
	constexpr size_t kPerRound = 4;
	std::vector<std::pair<Process *, size_t>> batch;
	bool left = false;
	{
		std::lock_guard lock(mu_);
		for (Process &p : processes_) {
			while (p.uffd && batch.size() < kPerRound && p.sweep < p.to_sweep.size()) {
				size_t i = p.to_sweep[p.sweep++];
				if (!(p.state[i] & kMapped)) {
					p.state[i] |= kMapped;
					batch.emplace_back(&p, i);
				}
			}
			left |= p.uffd && p.sweep < p.to_sweep.size();
		}
		if (ended_)
			return false;
	}
	for (auto [p, i] : batch)
		map_chunk(*p, i);
	return left;
}

void LazyDecoded::serve()
{
	std::vector<pollfd> fds{{stop_.get(), POLLIN, 0}};
	std::vector<Process *> by_fd{nullptr};
	for (Process &p : processes_)
		if (p.uffd) {
			fds.push_back({p.uffd->fd(), POLLIN, 0});
			by_fd.push_back(&p);
		}
	bool sweep = true;
	for (;;) {
		int n = poll(fds.data(), fds.size(), sweep ? 0 : -1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			fail(errno_error("%s", "poll the restored processes' userfaultfds"));
			return;
		}
		if (fds[0].revents)
			return;
		for (size_t k = 1; k < fds.size(); k++) {
			if (!fds[k].revents)
				continue;
			auto faults = by_fd[k]->uffd->read_faults();
			if (!faults) {
				fail(std::move(faults).error().context("pid %d (in the image)", by_fd[k]->ns_pid));
				return;
			}
			for (uint64_t addr : *faults)
				fault(*by_fd[k], addr);
		}
		if (sweep && n == 0)
			sweep = sweep_some();
	}
}

void LazyDecoded::fail(const Error &e)
{
	{
		std::lock_guard lock(mu_);
		if (!error_)
			error_ = e;
	}
	LOG_ERROR("%s", e.message().c_str());
	end_registrations();
}

// Every registration ends: whoever waits is woken, a later first touch maps the decoded memory as usual.
void LazyDecoded::end_registrations()
{
	std::lock_guard lock(mu_);
	ended_ = true;
	for (Process &p : processes_) {
		if (!p.uffd || p.unregistered)
			continue;
		p.unregistered = true;
		for (size_t i = 0; i < p.chunks.size();) {
			size_t j = i + 1;
			while (j < p.chunks.size() && p.chunks[j].start == p.chunks[j - 1].end)
				j++;
			if (Status st = p.uffd->unregister(p.chunks[i].start, p.chunks[j - 1].end - p.chunks[i].start); !st)
				LOG_DEBUG("pid %d (in the image): %s", p.ns_pid, st.error().message().c_str()); // it has gone
			i = j;
		}
		if (serving_)
			LOG_INFO("pid %d (in the image): its GPU state came in on demand: %u fault(s) served, %u waited for their "
				 "chunk to be decoded",
				 p.ns_pid, p.faults, p.waited);
	}
}

Status LazyDecoded::finish()
{
	{
		std::lock_guard lock(mu_);
		if (finished_)
			return error_ ? Status(*error_) : Status();
		finished_ = true;
	}
	end_registrations();
	if (server_.joinable()) {
		uint64_t one = 1;
		if (write(stop_.get(), &one, sizeof(one)) == sizeof(one))
			server_.join();
		else
			server_.detach(); // cannot be told: it ends with the process
	}
	std::lock_guard lock(mu_);
	return error_ ? Status(*error_) : Status();
}

std::set<pid_t> LazyDecoded::attach(const std::function<int(pid_t ns_pid)> &userfaultfd)
{
	std::vector<std::unique_ptr<Userfault>> fds;
	for (Process &p : processes_) {
		int fd = userfaultfd(p.ns_pid);
		if (fd < 0)
			LOG_INFO("pid %d (in the image): no userfaultfd for its decoded GPU state (%s): the driver's restore "
				 "waits for the whole decode",
				 p.ns_pid, std::strerror(-fd));
		fds.push_back(fd < 0 ? nullptr : std::make_unique<Userfault>(UniqueFd(fd)));
	}
	std::set<pid_t> lazy;
	bool serving = false;
	{
		std::lock_guard lock(mu_);
		for (size_t k = 0; k < processes_.size(); k++) {
			Process &p = processes_[k];
			if (!fds[k])
				continue;
			p.uffd = std::move(fds[k]);
			for (size_t i = 0; i < p.chunks.size(); i++)
				if (p.state[i] & kDecoded)
					p.to_sweep.push_back(i);
			lazy.insert(p.ns_pid);
		}
		if (!lazy.empty() && !finished_) {
			stop_ = UniqueFd(eventfd(0, EFD_CLOEXEC));
			try {
				if (stop_.valid())
					server_ = std::thread([this] { serve(); });
			} catch (const std::system_error &) {
			}
			serving = serving_ = server_.joinable();
		}
	}
	if (lazy.empty())
		return lazy;
	if (!serving) { // decoded already, or nothing to serve faults with: the memory is read as usual
		end_registrations();
		return {};
	}
	for (Process &p : processes_)
		if (p.uffd)
			LOG_INFO("pid %d (in the image): the driver's restore starts before its GPU state is decoded (%zu of %zu "
				 "chunk(s) so far): each first touch of a chunk not yet decoded waits for it",
				 p.ns_pid, p.to_sweep.size(), p.chunks.size());
	return lazy;
}

} // namespace cuda_criu
