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

} // namespace

std::vector<Status> run_jobs(std::vector<Job> jobs, unsigned max_parallel, unsigned timeout_ms,
			     const JobWatch &watch, unsigned watch_every_ms)
{
	const size_t n = jobs.size();
	if (max_parallel == 0 || max_parallel > n)
		max_parallel = static_cast<unsigned>(n);
	auto shared = std::make_shared<Shared>();
	shared->results.resize(n);

	std::vector<std::optional<Clock::time_point>> started(n);
	std::vector<Status> out(n);
	std::vector<bool> finished(n, false);
	size_t next = 0, running = 0, done = 0;
	auto next_watch = Clock::now() + std::chrono::milliseconds(watch_every_ms);

	std::unique_lock<std::mutex> lock(shared->mu);
	while (done < n) {
		while (running < max_parallel && next < n) {
			size_t i = next++;
			started[i] = Clock::now();
			running++;
			std::thread([shared, i, job = std::move(jobs[i].run)] {
				use_own_fs_context();
				Status st = job();
				std::lock_guard<std::mutex> g(shared->mu);
				shared->results[i] = std::move(st);
				shared->cv.notify_all();
			}).detach();
		}
		// Collect finished jobs and those past their deadline.
		auto now = Clock::now();
		std::optional<Clock::time_point> earliest;
		for (size_t i = 0; i < n; i++) {
			if (finished[i] || !started[i])
				continue;
			if (shared->results[i]) {
				out[i] = std::move(*shared->results[i]);
				if (!out[i])
					out[i] = std::move(out[i]).error().context("%s", jobs[i].what.c_str());
			} else if (timeout_ms && now - *started[i] >= std::chrono::milliseconds(timeout_ms)) {
				out[i] = make_error(ETIMEDOUT, "%s: no answer from the driver after %u ms", jobs[i].what.c_str(),
						    timeout_ms);
			} else {
				if (timeout_ms) {
					auto deadline = *started[i] + std::chrono::milliseconds(timeout_ms);
					if (!earliest || deadline < *earliest)
						earliest = deadline;
				}
				continue;
			}
			finished[i] = true;
			running--;
			done++;
		}
		if (done == n || (running < max_parallel && next < n))
			continue;
		if (watch && now >= next_watch) {
			// Unlocked: the watch reads /proc and may ask the driver; workers must not wait on it.
			lock.unlock();
			auto give_up = watch(finished);
			lock.lock();
			next_watch = Clock::now() + std::chrono::milliseconds(watch_every_ms);
			for (auto &[i, err] : give_up) {
				if (i >= n || finished[i] || !started[i] || shared->results[i])
					continue;
				out[i] = std::move(err).context("%s", jobs[i].what.c_str());
				finished[i] = true;
				running--;
				done++;
			}
			continue;
		}
		if (watch && (!earliest || next_watch < *earliest))
			earliest = next_watch;
		auto any_result = [&] {
			for (size_t i = 0; i < n; i++)
				if (!finished[i] && started[i] && shared->results[i])
					return true;
			return false;
		};
		if (earliest)
			shared->cv.wait_until(lock, *earliest, any_result);
		else
			shared->cv.wait(lock, any_result);
	}
	return out;
}

} // namespace cuda_criu
