#include "core/session.h"

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <memory>
#include <set>

#include "base/log.h"
#include "core/gpu_plan.h"
#include "core/parallel.h"

#ifndef CUDA_CRIU_VERSION
#define CUDA_CRIU_VERSION "dev"
#endif

namespace cuda_criu {

namespace {

std::string human_bytes(uint64_t b)
{
	if (b >= (1ULL << 30))
		return format("%.2f GiB", static_cast<double>(b) / (1ULL << 30));
	return format("%.1f MiB", static_cast<double>(b) / (1ULL << 20));
}

std::string seconds(uint64_t us) { return format("%.3f s", static_cast<double>(us) / 1e6); }

// Lets each listed restore thread run (on the calling thread, the tracer), runs the jobs on workers,
// then stops the threads again, whatever happened. A thread that cannot be let run fails its job.
std::vector<Status> run_with_restore_threads(Host &host, const std::vector<pid_t> &tids, std::vector<Job> jobs,
					     unsigned parallel, unsigned timeout_ms)
{
	std::vector<std::unique_ptr<RunningThread>> runs(tids.size());
	std::vector<std::optional<Error>> start_errors(tids.size());
	std::vector<Job> runnable;
	std::vector<size_t> index;
	for (size_t i = 0; i < tids.size(); i++) {
		auto run = host.let_run(tids[i]);
		if (!run) {
			start_errors[i] = std::move(run).error().context("%s", jobs[i].what.c_str());
			continue;
		}
		runs[i] = std::move(*run);
		runnable.push_back(std::move(jobs[i]));
		index.push_back(i);
	}
	std::vector<Status> done = run_jobs(std::move(runnable), parallel, timeout_ms);
	std::vector<Status> out(tids.size());
	for (size_t k = 0; k < index.size(); k++)
		out[index[k]] = std::move(done[k]);
	for (size_t i = 0; i < tids.size(); i++) {
		if (start_errors[i]) {
			out[i] = std::move(*start_errors[i]);
			continue;
		}
		if (auto st = runs[i]->stop(); !st) {
			if (out[i])
				out[i] = std::move(st).error().context("%s", "stop the restore thread again");
			else
				LOG_ERROR("%s", st.error().message().c_str());
		}
	}
	return out;
}

} // namespace

std::string PhaseCost::per_process() const
{
	uint64_t own = wall_us > driver_us + load_us ? wall_us - driver_us - load_us : 0;
	return format("%.2f ms/process", processes ? own / 1000.0 / processes : 0.0);
}

// ---------------------------------------------------------------------------------------------- dump

DumpSession::DumpSession(Options options, Host &host, DriverSource driver, GuardSource guard)
	: options_(std::move(options)), host_(host), driver_source_(std::move(driver)), guard_source_(std::move(guard))
{
}

Status DumpSession::load_driver()
{
	if (driver_)
		return {};
	uint64_t t0 = now_us();
	// The guard is forked first, while this process has no driver threads.
	if (guard_source_) {
		if (auto g = guard_source_())
			guard_ = std::move(*g);
		else
			LOG_WARN("no guard for this dump (%s): if CRIU dies mid-dump, run cuda-criu resume on the CUDA "
				 "processes",
				 g.error().message().c_str());
	}
	auto d = driver_source_();
	pause_cost_.load_us += now_us() - t0;
	if (!d)
		return std::move(d).error();
	timed_ = std::make_unique<TimedDriver>(**d);
	driver_ = timed_.get();
	return {};
}

Result<bool> DumpSession::pause(pid_t pid)
{
	if (!host_.uses_libcuda(pid))
		return false;
	uint64_t t0 = now_us();
	if (auto st = load_driver(); !st)
		return std::move(st).error().context("pid %d uses CUDA, but its GPU state cannot be saved", pid);
	auto r = pause_cuda(pid);
	if (r && *r) {
		uint64_t t1 = now_us();
		pause_cost_.wall_us += t1 - t0;
		pause_cost_.driver_us += timed_->covered_us(t0, t1);
		pause_cost_.processes++;
	}
	return r;
}

Result<bool> DumpSession::pause_cuda(pid_t pid)
{
	auto tid = driver_->restore_thread_id(pid);
	if (!tid) {
		// libcuda is loaded but no CUDA context exists (e.g. a worker that imported a CUDA library).
		LOG_INFO("pid %d has libcuda loaded but no CUDA state to save (%s); dumping it as a plain process",
			 pid, tid.error().message().c_str());
		return false;
	}
	auto state = driver_->state(pid);
	if (!state)
		return std::move(state).error().context("pid %d", pid);
	Proc p;
	p.pid = pid;
	p.restore_tid = *tid;
	p.initial = *state;
	TaskInfo info = host_.task_info(pid);
	p.ns_pid = info.ns_pid;
	p.rss_before = info.rss_bytes;
	if (machine_gpus_.empty()) {
		if (auto gpus = driver_->gpus())
			machine_gpus_ = std::move(*gpus);
		kernel_gpus_ = host_.machine_gpus();
	}
	// The GPUs whose device nodes the process holds: every GPU visible to it.
	for (unsigned minor : info.nvidia_minors) {
		std::optional<GpuUuid> uuid;
		for (const GpuInfo &g : kernel_gpus_)
			if (g.ordinal == static_cast<int>(minor))
				uuid = g.uuid;
		if (kernel_gpus_.empty() && minor < machine_gpus_.size()) // no /proc/driver/nvidia: minors follow ordinals
			uuid = machine_gpus_[minor].uuid;
		if (uuid)
			p.gpu_uuids.push_back(*uuid);
	}

	switch (*state) {
	case CudaState::Failed:
		return make_error(EIO,
				  "pid %d: its CUDA state is 'failed' (an earlier checkpoint or restore of it went "
				  "wrong); it cannot be checkpointed",
				  pid);
	case CudaState::Locked:
	case CudaState::Checkpointed:
		if (*state == CudaState::Locked)
			guard_.watch(pid, CudaState::Locked); // it will be checkpointed
		LOG_INFO("pid %d was already %s; it is dumped as it is and left %s", pid, to_string(*state),
			 to_string(*state));
		break;
	case CudaState::Running: {
		guard_.watch(pid, CudaState::Running);
		// The driver honours the lock timeout itself; the job's own limit only guards against a driver
		// that does not return at all.
		Driver *d = driver_;
		unsigned ms = options_.lock_timeout_ms;
		std::vector<Job> job;
		job.push_back({format("lock pid %d", pid), [d, pid, ms] { return d->lock(pid, ms); }});
		uint64_t t0 = now_us();
		Status st = std::move(run_jobs(std::move(job), 1, ms ? ms + kDriverGraceMs : 0)[0]);
		p.lock_us = now_us() - t0;
		if (!st) {
			Error err = std::move(st).error();
			if (err.errno_value() == ETIMEDOUT)
				err = std::move(err).context("%s", format("CUDA work in flight did not finish within the lock "
									 "timeout of %.1f s (raise CUDA_CRIU_LOCK_TIMEOUT)",
									 options_.lock_timeout_ms / 1000.0)
									  .c_str());
			// A lock that failed half way must not leave the process blocked.
			if (auto now = driver_->state(pid); now && *now == CudaState::Locked)
				(void)driver_->unlock(pid);
			return err;
		}
		p.locked_by_us = true;
		break;
	}
	}
	LOG_DEBUG("pid %d: %s, restore thread %d, %zu GPU(s); lock %.1f ms", pid, to_string(p.initial), p.restore_tid,
		  p.gpu_uuids.size(), p.lock_us / 1000.0);
	procs_.push_back(std::move(p));
	return true;
}

Status DumpSession::checkpoint_all()
{
	std::vector<pid_t> tids;
	std::vector<Job> jobs;
	std::vector<Proc *> targets;
	for (Proc &p : procs_) {
		if (p.initial == CudaState::Checkpointed)
			continue;
		targets.push_back(&p);
		tids.push_back(p.restore_tid);
		Driver *d = driver_;
		pid_t pid = p.pid;
		uint64_t *spent = &p.checkpoint_us; // each job writes only its own process's slot
		jobs.push_back({format("checkpoint pid %d", pid), [d, pid, spent]() {
					uint64_t t0 = now_us();
					Status st = d->checkpoint(pid);
					*spent = now_us() - t0;
					return st;
				}});
	}
	if (targets.empty())
		return {};
	LOG_INFO("checkpointing %zu CUDA process(es)%s", targets.size(),
		 targets.size() > 1 ? " in parallel" : "");
	uint64_t t0 = now_us();
	std::vector<Status> results =
		run_with_restore_threads(host_, tids, std::move(jobs), options_.parallel, options_.checkpoint_timeout_ms);
	device_phase_us_ = now_us() - t0;
	Status first_failure;
	for (size_t i = 0; i < targets.size(); i++) {
		Proc &p = *targets[i];
		if (results[i]) {
			p.checkpointed_by_us = true;
			uint64_t rss = host_.task_info(p.pid).rss_bytes;
			p.state_bytes = rss > p.rss_before ? rss - p.rss_before : 0;
			continue;
		}
		// A timed-out or failed checkpoint may still have moved the state: ask, so rollback knows.
		if (auto now = driver_->state(p.pid); now && *now == CudaState::Checkpointed)
			p.checkpointed_by_us = true;
		p.checkpoint_error = std::move(results[i]).error();
		LOG_ERROR("%s", p.checkpoint_error->message().c_str());
		if (first_failure)
			first_failure = *p.checkpoint_error;
	}
	return first_failure;
}

Result<bool> DumpSession::checkpoint(pid_t pid)
{
	auto it = std::find_if(procs_.begin(), procs_.end(), [&](const Proc &p) { return p.pid == pid; });
	if (it == procs_.end())
		return false;
	if (!checkpointed_) {
		checkpointed_ = true;
		// Any failure fails the dump at once (at whichever pid CRIU asks first): every process is then
		// returned to its state in finish().
		uint64_t t0 = now_us();
		Status st = checkpoint_all();
		uint64_t t1 = now_us();
		checkpoint_cost_ = {t1 - t0, timed_->covered_us(t0, t1), 0, static_cast<unsigned>(procs_.size())};
		if (!st)
			return make_error(st.error().errno_value(), "%s", "checkpoint of the CUDA processes failed (see above)");
	}
	if (it->checkpoint_error)
		return make_error(it->checkpoint_error->errno_value(), "checkpoint of pid %d failed (see above)", pid);
	return true;
}

Status DumpSession::finish(bool dump_failed, bool leave_running)
{
	if (!dump_failed && !leave_running)
		return {}; // CRIU kills the tasks now; their GPU state is in the image
	std::vector<pid_t> tids;
	std::vector<Job> jobs;
	std::vector<Proc *> targets;
	for (Proc &p : procs_) {
		bool restore = p.checkpointed_by_us;
		bool unlock = p.locked_by_us;
		if (!restore && !unlock)
			continue;
		if (!host_.alive(p.pid)) {
			LOG_WARN("pid %d exited during the dump; there is nothing to return to its state", p.pid);
			continue;
		}
		targets.push_back(&p);
		tids.push_back(p.restore_tid);
		Driver *d = driver_;
		pid_t pid = p.pid;
		jobs.push_back({format("return pid %d to %s", pid, to_string(p.initial)), [d, pid, restore, unlock]() -> Status {
					if (restore)
						if (auto st = d->restore(pid, {}); !st)
							return std::move(st).error();
					if (unlock)
						if (auto st = d->unlock(pid); !st)
							return std::move(st).error();
					return {};
				}});
	}
	if (targets.empty())
		return {};
	LOG_INFO("%s: returning %zu CUDA process(es) to the state they were found in",
		 dump_failed ? "dump failed" : "leave-running", targets.size());
	uint64_t t0 = now_us();
	std::vector<Status> results =
		run_with_restore_threads(host_, tids, std::move(jobs), options_.parallel, options_.restore_timeout_ms);
	rollback_us_ = now_us() - t0;
	std::string failed;
	for (size_t i = 0; i < targets.size(); i++) {
		Proc &p = *targets[i];
		if (results[i]) {
			p.checkpointed_by_us = p.locked_by_us = false;
			continue;
		}
		std::string now = "unknown";
		if (auto s = driver_->state(p.pid))
			now = to_string(*s);
		LOG_ERROR("could not return pid %d to its CUDA state '%s' (it is now '%s'): %s; if it still runs, "
			  "resume it with: cuda-criu resume %d",
			  p.pid, to_string(p.initial), now.c_str(), results[i].error().message().c_str(), p.pid);
		failed += (failed.empty() ? "" : ", ") + std::to_string(p.pid);
	}
	if (!failed.empty())
		return make_error(EIO, "CUDA processes not returned to their state: %s", failed.c_str());
	LOG_INFO("all CUDA processes are back as they were found (%s)", seconds(rollback_us_).c_str());
	return {};
}

// The machine's GPUs, those some process held (used) or the others: the driver's list (ordinals,
// memory), then those only the kernel driver lists (hidden from CRIU by CUDA_VISIBLE_DEVICES).
std::vector<GpuRecord> DumpSession::machine_gpu_records(bool used) const
{
	std::set<GpuUuid> held, listed;
	for (const Proc &p : procs_)
		held.insert(p.gpu_uuids.begin(), p.gpu_uuids.end());
	std::vector<GpuRecord> out;
	for (const GpuInfo &g : machine_gpus_) {
		listed.insert(g.uuid);
		if (held.count(g.uuid) == used)
			out.push_back({g.uuid, g.name, g.memory_bytes, g.pci_bus_id, g.ordinal});
	}
	for (const GpuInfo &g : kernel_gpus_)
		if (!listed.count(g.uuid) && held.count(g.uuid) == used)
			out.push_back({g.uuid, g.name, 0, g.pci_bus_id, -1});
	return out;
}

ImageRecord DumpSession::image_record() const
{
	ImageRecord r;
	r.driver_version = driver_ ? driver_->version() : "";
	r.plugin_version = CUDA_CRIU_VERSION;
	r.gpus = machine_gpu_records(true);
	r.other_gpus = machine_gpu_records(false);
	for (const Proc &p : procs_)
		r.processes.push_back({p.pid, p.ns_pid, p.initial, p.gpu_uuids, p.state_bytes, p.lock_us,
				       p.checkpoint_us});
	r.device_phase_us = device_phase_us_;
	r.created_unix = static_cast<uint64_t>(std::time(nullptr));
	char host[256] = {};
	gethostname(host, sizeof(host) - 1);
	r.hostname = host;
	return r;
}

std::string DumpSession::summary() const
{
	uint64_t bytes = 0, lock = 0;
	for (const Proc &p : procs_) {
		bytes += p.state_bytes;
		lock += p.lock_us;
	}
	return format("dump: %zu CUDA process(es), %s of GPU state, lock %s, checkpoint %s (wall, all processes); "
		      "plugin's own time beyond the driver: lock %s, checkpoint %s",
		      procs_.size(), human_bytes(bytes).c_str(), seconds(lock).c_str(), seconds(device_phase_us_).c_str(),
		      pause_cost_.per_process().c_str(), checkpoint_cost_.per_process().c_str());
}

// ------------------------------------------------------------------------------------------- restore

RestoreSession::RestoreSession(Options options, Host &host, DriverSource driver, std::optional<ImageRecord> image,
			       bool criu_fails_on_error, RestoreGuard guard)
	: options_(std::move(options)), host_(host), driver_source_(std::move(driver)), image_(std::move(image)),
	  criu_fails_on_error_(criu_fails_on_error), guard_(std::move(guard))
{
}

Result<std::vector<GpuPair>> RestoreSession::gpu_pairs(Driver &driver)
{
	if (!image_ || image_->gpus.empty()) {
		if (!options_.device_map.empty())
			return make_error(EINVAL, "%s",
					  "a device map needs the GPU list of cuda-plugin.img, which this image lacks (it was "
					  "made by CRIU's own CUDA plugin or by a dump without GPU information)");
		return std::vector<GpuPair>();
	}
	auto here = driver.gpus();
	if (!here)
		return std::move(here).error().context("%s", "list this machine's GPUs");
	for (GpuInfo &g : *here)
		g.free_bytes = driver.free_bytes(g.uuid);
	auto plan = plan_gpus(*image_, *here, host_.machine_gpus(), options_.device_map);
	if (!plan)
		return std::move(plan).error().context("%s", "cannot restore the image's GPU state on this machine");
	if (!plan->pairs.empty())
		LOG_INFO("restoring with GPU pairs: %s", plan->description.c_str());
	return plan->pairs;
}

void RestoreSession::restore_batch(const std::vector<pid_t> &candidates)
{
	std::set<pid_t> in_image;
	if (image_)
		for (const ProcessRecord &p : image_->processes)
			in_image.insert(p.ns_pid);

	// Which candidates are CUDA processes: libcuda mapped (no driver call) and a restore thread.
	Driver *driver = nullptr;
	std::vector<pid_t> pids, tids;
	for (pid_t pid : candidates) {
		if (seen_.count(pid))
			continue;
		seen_[pid] = false;
		TaskInfo info = host_.task_info(pid);
		bool expected = in_image.count(info.ns_pid) > 0;
		if (!expected && !host_.uses_libcuda(pid))
			continue;
		if (!driver && !timed_) {
			uint64_t t0 = now_us();
			auto d = driver_source_();
			restore_cost_.load_us += now_us() - t0;
			if (!d) {
				seen_[pid] = true;
				outcomes_[pid].error = std::move(d).error().context("restore GPU state of pid %d", pid);
				continue;
			}
			timed_ = std::make_unique<TimedDriver>(**d);
		}
		driver = timed_.get();
		auto tid = driver->restore_thread_id(pid);
		if (!tid) {
			if (expected) {
				seen_[pid] = true;
				outcomes_[pid].error = std::move(tid).error().context("restore pid %d", pid);
			}
			continue;
		}
		seen_[pid] = true;
		outcomes_[pid].ns_pid = info.ns_pid;
		pids.push_back(pid);
		tids.push_back(*tid);
	}

	std::vector<Job> jobs;
	Result<std::vector<GpuPair>> pairs = std::vector<GpuPair>();
	if (!pids.empty())
		pairs = gpu_pairs(*driver);
	if (!pairs) {
		// Refused before any restore call: every process is still stopped, none runs without its state.
		for (pid_t pid : pids)
			outcomes_[pid].error = pairs.error();
		pids.clear();
		tids.clear();
	}
	for (pid_t pid : pids) {
		guard_.restoring(pid); // from here on, if CRIU dies, the guard kills pid
		uint64_t *spent = &outcomes_[pid].restore_us; // std::map nodes are stable
		std::vector<GpuPair> p = *pairs;
		jobs.push_back({format("restore pid %d", pid), [driver, pid, spent, p]() -> Status {
					uint64_t t0 = now_us();
					Status st = driver->restore(pid, p);
					if (st)
						st = driver->unlock(pid);
					*spent = now_us() - t0;
					return st;
				}});
	}
	if (!jobs.empty()) {
		LOG_INFO("restoring %zu CUDA process(es)%s", jobs.size(), jobs.size() > 1 ? " in parallel" : "");
		uint64_t t0 = now_us();
		std::vector<Status> results =
			run_with_restore_threads(host_, tids, std::move(jobs), options_.parallel, options_.restore_timeout_ms);
		device_phase_us_ += now_us() - t0;
		for (size_t i = 0; i < pids.size(); i++) {
			if (results[i])
				guard_.restored(pids[i]);
			else
				outcomes_[pids[i]].error = std::move(results[i]).error();
		}
	}

	if (image_) {
		std::set<pid_t> found;
		for (const auto &[pid, o] : outcomes_)
			found.insert(o.ns_pid);
		// Named one by one up to a few: an image can name far more processes than the log should hold.
		constexpr size_t kNamed = 10;
		size_t missing = 0;
		for (const ProcessRecord &p : image_->processes)
			if (!found.count(p.ns_pid) && missing_reported_.insert(p.ns_pid).second && ++missing <= kNamed)
				LOG_WARN("process %d of the image (pid %d in its namespace) was not found among the restored "
					 "tasks yet",
					 p.pid, p.ns_pid);
		if (missing > kNamed)
			LOG_WARN("%zu more processes of the image were not found among the restored tasks yet",
				 missing - kNamed);
	}
}

Result<bool> RestoreSession::resume(pid_t pid)
{
	if (!seen_.count(pid)) {
		uint64_t t0 = now_us();
		size_t before = outcomes_.size();
		std::vector<pid_t> candidates = host_.stopped_tasks();
		if (std::find(candidates.begin(), candidates.end(), pid) == candidates.end())
			candidates.push_back(pid);
		restore_batch(candidates);
		uint64_t t1 = now_us();
		restore_cost_.wall_us += t1 - t0;
		restore_cost_.driver_us += timed_ ? timed_->covered_us(t0, t1) : 0;
		restore_cost_.processes += static_cast<unsigned>(outcomes_.size() - before);
		if (any_failed() && !criu_fails_on_error_ && !killed_) {
			// This CRIU would report success anyway: make sure no process runs without its GPU state.
			killed_ = true;
			for (const auto &[p, o] : outcomes_)
				if (o.error)
					LOG_ERROR("%s", o.error->message().c_str());
			LOG_ERROR("GPU state could not be restored; this CRIU does not fail a restore for that, so the "
				  "restored processes are killed now (apply criu-patches/ to make criu restore fail instead)");
			for (pid_t p : candidates)
				host_.kill(p);
		}
	}
	auto it = outcomes_.find(pid);
	if (it == outcomes_.end())
		return false;
	if (it->second.error)
		return *it->second.error;
	return true;
}

bool RestoreSession::any_failed() const
{
	return std::any_of(outcomes_.begin(), outcomes_.end(), [](const auto &kv) { return kv.second.error.has_value(); });
}

std::string RestoreSession::summary() const
{
	size_t failed = 0;
	for (const auto &[pid, o] : outcomes_)
		failed += o.error ? 1 : 0;
	return format("restore: %zu CUDA process(es), %zu failed, restore+unlock %s (wall, all processes); driver "
		      "load %s; plugin's own time beyond the driver: %s%s",
		      outcomes_.size(), failed, seconds(device_phase_us_).c_str(), seconds(restore_cost_.load_us).c_str(),
		      restore_cost_.per_process().c_str(),
		      image_ ? "" : " [image of CRIU's own cuda plugin: no cuda-plugin.img]");
}

} // namespace cuda_criu
