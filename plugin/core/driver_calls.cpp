#include "core/driver_calls.h"

#include <atomic>

#include "base/format.h"
#include "base/log.h"

namespace cuda_criu {

std::vector<ProcResult> run_proc_jobs(Host &host, const SharedDriver &driver, std::vector<ProcJob> jobs,
				      unsigned parallel, unsigned timeout_ms)
{
	const size_t n = jobs.size();
	std::vector<std::unique_ptr<RunningThread>> runs(n);
	std::vector<ProcResult> out(n);
	std::vector<std::shared_ptr<std::atomic<uint64_t>>> spent(n); // shared: abandoned calls write late
	std::vector<Job> runnable;
	std::vector<size_t> index;
	for (size_t i = 0; i < n; i++) {
		auto run = host.let_run(jobs[i].restore_tid);
		if (!run) {
			out[i].status = std::move(run).error().context("%s", jobs[i].what.c_str());
			continue;
		}
		runs[i] = std::move(*run);
		spent[i] = std::make_shared<std::atomic<uint64_t>>(0);
		runnable.push_back({jobs[i].what, [driver, slot = spent[i], call = std::move(jobs[i].call)]() {
					    uint64_t t0 = now_us();
					    Status st = call(*driver);
					    *slot = now_us() - t0;
					    return st;
				    }});
		index.push_back(i);
	}
	std::vector<Status> done = run_jobs(std::move(runnable), parallel, timeout_ms);
	for (size_t k = 0; k < index.size(); k++) {
		size_t i = index[k];
		out[i].status = std::move(done[k]);
		out[i].us = spent[i]->load();
		if (auto st = runs[i]->stop(); !st) {
			if (out[i].status)
				out[i].status = std::move(st).error().context("%s", "stop the restore thread again");
			else
				LOG_ERROR("%s", st.error().message().c_str());
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
