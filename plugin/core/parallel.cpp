#include "core/parallel.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "os/fs_context.h"

namespace cuda_criu {
namespace {

using Clock = std::chrono::steady_clock;

// Shared between the caller and the workers; outlives the caller when a job is abandoned.
struct Shared {
	std::mutex mu;
	std::condition_variable cv;
	std::vector<std::optional<Status>> results;
};

// The waiting thread's view of the jobs: which started when, which have ended, and their results.
class Tracker {
public:
	Tracker(std::vector<Job> &jobs, std::shared_ptr<Shared> shared)
		: jobs_(jobs), shared_(std::move(shared)), started_(jobs.size()), out_(jobs.size()),
		  finished_(jobs.size(), false)
	{
		shared_->results.resize(jobs.size());
	}

	size_t size() const { return jobs_.size(); }
	bool all_done() const { return done_ == size(); }
	bool may_start(unsigned max_parallel) const { return running_ < max_parallel && next_ < size(); }
	const std::vector<bool> &finished() const { return finished_; }
	std::vector<Status> take() { return std::move(out_); }

	// Starts the next job on a thread of its own.
	void start_next()
	{
		size_t i = next_++;
		started_[i] = Clock::now();
		running_++;
		own_thread([shared = shared_, i, job = std::move(jobs_[i].run)] {
			use_own_fs_context();
			Status st = job();
			std::lock_guard<std::mutex> g(shared->mu);
			shared->results[i] = std::move(st);
			shared->cv.notify_all();
		}).detach();
	}

	// Takes the results that came and times out the jobs past their deadline; returns the earliest
	// deadline still ahead. Called with shared.mu held.
	std::optional<Clock::time_point> collect(unsigned timeout_ms)
	{
		auto now = Clock::now();
		std::optional<Clock::time_point> earliest;
		for (size_t i = 0; i < size(); i++) {
			if (!waiting(i))
				continue;
			if (shared_->results[i]) {
				Status st = std::move(*shared_->results[i]);
				if (!st)
					st = std::move(st).error().context("%s", jobs_[i].what.c_str());
				end(i, std::move(st));
			} else if (timeout_ms && now - *started_[i] >= std::chrono::milliseconds(timeout_ms)) {
				end(i, make_error(ETIMEDOUT, "%s: no answer from the driver after %u ms", jobs_[i].what.c_str(),
						  timeout_ms));
			} else if (timeout_ms) {
				auto deadline = *started_[i] + std::chrono::milliseconds(timeout_ms);
				if (!earliest || deadline < *earliest)
					earliest = deadline;
			}
		}
		return earliest;
	}

	// Gives up the jobs the watch names, unless they have ended meanwhile. Called with shared.mu held.
	void give_up(std::vector<std::pair<size_t, Error>> &jobs)
	{
		for (auto &[i, err] : jobs)
			if (i < size() && waiting(i) && !shared_->results[i])
				end(i, std::move(err).context("%s", jobs_[i].what.c_str()));
	}

	// Whether a running job has a result to collect. Called with shared.mu held.
	bool any_result() const
	{
		for (size_t i = 0; i < size(); i++)
			if (waiting(i) && shared_->results[i])
				return true;
		return false;
	}

private:
	bool waiting(size_t i) const { return started_[i] && !finished_[i]; }
	void end(size_t i, Status st)
	{
		out_[i] = std::move(st);
		finished_[i] = true;
		running_--;
		done_++;
	}

	std::vector<Job> &jobs_;
	std::shared_ptr<Shared> shared_; // the workers hold it too: an abandoned one outlives run_jobs
	std::vector<std::optional<Clock::time_point>> started_;
	std::vector<Status> out_;
	std::vector<bool> finished_;
	size_t next_ = 0, running_ = 0, done_ = 0;
};

} // namespace

std::vector<Status> run_jobs(std::vector<Job> jobs, unsigned max_parallel, unsigned timeout_ms,
			     const JobWatch &watch, unsigned watch_every_ms, const JobTend &tend)
{
	// After a traced thread's stop more follow at once (a system call's exit after its entry): the
	// waiting thread looks again without sleeping for a while, then every 200 us.
	constexpr auto kTendSpin = std::chrono::milliseconds(2);
	constexpr auto kTendEvery = std::chrono::microseconds(200);
	auto last_tended = Clock::now();
	if (max_parallel == 0 || max_parallel > jobs.size())
		max_parallel = static_cast<unsigned>(jobs.size());
	auto shared = std::make_shared<Shared>();
	Tracker t(jobs, shared);
	auto next_watch = Clock::now() + std::chrono::milliseconds(watch_every_ms);

	std::unique_lock<std::mutex> lock(shared->mu);
	while (!t.all_done()) {
		while (t.may_start(max_parallel))
			t.start_next();
		auto earliest = t.collect(timeout_ms);
		if (t.all_done() || t.may_start(max_parallel))
			continue;
		if (watch && Clock::now() >= next_watch) {
			// Unlocked: the watch reads /proc and may ask the driver; workers must not wait on it.
			lock.unlock();
			auto give_up = watch(t.finished());
			lock.lock();
			next_watch = Clock::now() + std::chrono::milliseconds(watch_every_ms);
			t.give_up(give_up);
			continue;
		}
		if (watch && (!earliest || next_watch < *earliest))
			earliest = next_watch;
		if (tend) {
			// Unlocked, as the watch: handling a stop may take a while (the buffer populated).
			lock.unlock();
			bool busy = tend();
			lock.lock();
			auto now = Clock::now();
			if (busy)
				last_tended = now;
			if (t.any_result())
				continue;
			auto soon = now - last_tended < kTendSpin ? now : now + kTendEvery;
			if (!earliest || soon < *earliest)
				earliest = soon;
		}
		if (earliest)
			shared->cv.wait_until(lock, *earliest, [&] { return t.any_result(); });
		else
			shared->cv.wait(lock, [&] { return t.any_result(); });
	}
	return t.take();
}

} // namespace cuda_criu
