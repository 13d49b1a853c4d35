#include "core/driver_calls.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "base/format.h"
#include "base/log.h"
#include "core/progress.h"

namespace cuda_criu {
namespace {

// The watch of run_jobs for a phase's progress: samples each runnable job's process (index: job of each
// runnable), logs a line every few seconds, gives up a job whose copy stalled.
JobWatch watch_progress(Host &host, const PhaseProgress &pp, const std::vector<ProcJob> &jobs, const std::vector<size_t> &index)
{
	std::vector<Progress::Proc> procs;
	std::vector<std::pair<pid_t, pid_t>> threads;
	for (size_t i : index) {
		procs.push_back({jobs[i].pid, i < pp.expected.size() ? pp.expected[i] : 0});
		threads.emplace_back(jobs[i].pid, jobs[i].restore_tid);
	}
	auto progress = std::make_shared<Progress>(pp.phase, std::move(procs), pp.stall_ms * 1000ULL,
						   pp.every_ms * 1000ULL, now_us(), pp.stall_needs_bytes);
	return [&host, progress, threads, index, bytes = pp.bytes, show = pp.show](const std::vector<bool> &ended) {
		std::vector<std::pair<size_t, Error>> give_up;
		uint64_t now = now_us();
		for (size_t k = 0; k < index.size(); k++) {
			ProgressSample s{bytes ? bytes(index[k]) : 0, host.thread_cpu_ticks(threads[k].first, threads[k].second)};
			progress->observe(k, s, ended[k], now);
		}
		if (auto line = progress->line(now)) {
			if (show)
				show(*line);
			else
				LOG_INFO("%s", line->c_str());
		}
		if (auto k = progress->stalled(now)) {
			give_up.emplace_back(*k, make_error(ETIMEDOUT, "%s (raise CUDA_CRIU_STALL_TIMEOUT if the driver is "
								       "only slow)",
							    progress->stall_message(*k, now).c_str()));
			progress->observe(*k, {}, true, now); // given up: not reported again
		}
		return give_up;
	};
}

} // namespace

std::vector<ProcResult> run_proc_jobs(Host &host, const SharedDriver &driver, std::vector<ProcJob> jobs,
				      unsigned parallel, unsigned timeout_ms, const PhaseProgress *progress)
{
	const size_t n = jobs.size();
	std::vector<std::unique_ptr<RunningThread>> runs(n);
	std::vector<ProcResult> out(n);
	std::vector<std::shared_ptr<std::atomic<uint64_t>>> spent(n); // shared: abandoned calls write late
	std::vector<std::shared_ptr<std::optional<CudaState>>> after(n);
	std::vector<Job> runnable;
	std::vector<size_t> index;
	// Set once the results are collected: a call that returns after its job was given up asks nothing more
	// (its restore thread is stopped again by then, so a state query would only block), and a state query
	// that was under way then writes nothing the caller reads.
	struct Collected {
		std::mutex mu;
		bool done = false;
	};
	auto collected = std::make_shared<Collected>();
	for (size_t i = 0; i < n; i++) {
		if (jobs[i].stopped) {
			auto run = host.let_run(jobs[i].restore_tid, jobs[i].buffer);
			if (!run) {
				out[i].status = std::move(run).error().context("%s", jobs[i].what.c_str());
				continue;
			}
			runs[i] = std::move(*run);
		}
		spent[i] = std::make_shared<std::atomic<uint64_t>>(0);
		after[i] = std::make_shared<std::optional<CudaState>>();
		runnable.push_back({jobs[i].what, [driver, pid = jobs[i].pid, slot = spent[i], state = after[i],
						   collected, call = std::move(jobs[i].call)]() {
					    uint64_t t0 = now_us();
					    Status st = call(*driver);
					    *slot = now_us() - t0;
					    if (st)
						    return st;
					    {
						    std::lock_guard<std::mutex> g(collected->mu);
						    if (collected->done)
							    return st;
					    }
					    auto s = driver->state(pid);
					    std::lock_guard<std::mutex> g(collected->mu);
					    if (s && !collected->done)
						    *state = *s;
					    return st;
				    }});
		index.push_back(i);
	}
	// Each stop of a restore thread let run waits for tend (os/thread_run.h): its traced calls, a stop
	// signal pending for its process.
	JobTend tend;
	if (std::any_of(runs.begin(), runs.end(), [](const auto &run) { return run != nullptr; }))
		tend = [&runs] {
			bool any = false;
			for (auto &run : runs)
				if (run && run->tend())
					any = true;
			return any;
		};
	std::vector<Status> done = run_jobs(std::move(runnable), parallel, timeout_ms,
					    progress ? watch_progress(host, *progress, jobs, index) : JobWatch(), 500, tend);
	{
		std::lock_guard<std::mutex> g(collected->mu);
		collected->done = true;
	}
	for (size_t k = 0; k < index.size(); k++) {
		size_t i = index[k];
		out[i].status = std::move(done[k]);
		out[i].us = spent[i]->load();
		if (!out[i].status && out[i].us) // the call returned: its state query ran before the thread stopped
			out[i].state_after_failure = *after[i];
		if (!runs[i])
			continue;
		Status stopped = runs[i]->stop();
		out[i].buffer = runs[i]->buffer_report();
		// Not the call's failure: a call that succeeded stays a success, and the sessions decide what a
		// thread left so means for them.
		if (!stopped) {
			LOG_ERROR("%s %s its restore thread could not be stopped again: %s", jobs[i].what.c_str(),
				  out[i].status ? "succeeded, but" : "failed, and", stopped.error().message().c_str());
			out[i].thread_error = std::move(stopped).error();
		}
	}
	return out;
}

std::string PhaseCost::per_process() const
{
	uint64_t own = wall_us > driver_us + load_us ? wall_us - driver_us - load_us : 0;
	return format("%.2f ms/process", processes ? own / 1000.0 / processes : 0.0);
}

void PhaseClock::charge(PhaseCost &cost, const TimedDriver *driver, unsigned processes) const
{
	uint64_t t1 = now_us();
	cost.wall_us += t1 - t0_;
	cost.driver_us += driver ? driver->covered_us(t0_, t1) : 0;
	cost.processes += processes;
}

std::string seconds(uint64_t us) { return format("%.3f s", static_cast<double>(us) / 1e6); }

} // namespace cuda_criu
