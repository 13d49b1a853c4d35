#include "core/restore_session.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include <unistd.h>

#include "base/clock.h"
#include "base/format.h"
#include "base/text.h"
#include "base/log.h"
#include "core/background.h"
#include "core/gpu_plan.h"
#include "os/fs_context.h"

namespace cuda_criu {

RestoreSession::RestoreSession(Options options, Host &host, DriverSource driver, std::optional<ImageRecord> image,
			       bool criu_fails_on_error, RestoreGuard guard, GpuImageLoad load_gpu)
	: options_(std::move(options)), host_(host), driver_source_(std::move(driver)), image_(std::move(image)),
	  criu_fails_on_error_(criu_fails_on_error), guard_(std::move(guard)), load_gpu_(std::move(load_gpu))
{
}

RestoreSession::~RestoreSession()
{
	if (!mapped_checked_.valid())
		return;
	cancel_check_->store(true);
	mapped_checked_.wait(); // each thread stops at its next chunk
}

void RestoreSession::start_check(std::function<void()> own_fs)
{
	if (!load_gpu_.check_mapped || mapped_checked_.valid())
		return;
	auto done = std::make_shared<std::promise<Status>>();
	mapped_checked_ = done->get_future().share();
	// Copies only: the thread may outlive a failed restore's session by one chunk.
	try {
		Background::start(
			std::move(own_fs),
			[done, check = load_gpu_.check_mapped, cancel = cancel_check_, spent = mapped_check_us_] {
				uint64_t t0 = now_us();
				Status st;
				try {
					st = check(*cancel);
				} catch (const std::exception &e) {
					st = make_error(ENOMEM, "internal error: %s", e.what());
				}
				*spent = now_us() - t0;
				if (!st)
					st = std::move(st).error().context("%s", "the GPU image CRIU maps failed its check; the "
										 "processes are not unlocked");
				done->set_value(std::move(st));
			},
			5000);
	} catch (const std::exception &e) { // no thread: nothing else sets the result
		done->set_value(make_error(EAGAIN, "cannot start the check of the GPU image CRIU maps: %s", e.what()));
	}
}

// Other restores' reservations less what their processes have allocated on the GPU so far: while the driver
// restores a process, what it has allocated shows in the GPU's free memory, and would otherwise count twice
// (free memory and reservation), refusing restores that fit (4 replicas of 24 GiB on a GPU of 140 GiB, the
// last to come seeing 0 free). Only where the entry names a process that descends from its CRIU now (a
// process that CRIU is restoring, not another that happens to have its number) and the driver tells its
// memory on that GPU; to be read before the free memory, so that what is allocated in between counts
// twice rather than not at all.
std::vector<GpuReservation> RestoreSession::not_yet_allocated(std::vector<GpuReservation> others)
{
	std::map<GpuUuid, std::optional<ProcessBytes>> used;
	for (GpuReservation &r : others) {
		if (r.process <= 0 || !host_.descends_from(r.process, r.owner))
			continue;
		auto it = used.find(r.gpu);
		if (it == used.end()) {
			GpuUuid uuid = r.gpu;
			auto got = ask<std::optional<ProcessBytes>>(driver_, kDriverGraceMs,
								   format("query the GPU memory of the processes on %s", uuid.str().c_str()),
								   [uuid](Driver &d) -> Result<std::optional<ProcessBytes>> { return d.gpu_bytes_on(uuid); });
			it = used.emplace(uuid, got ? std::move(*got) : std::nullopt).first;
		}
		if (!it->second)
			continue;
		auto p = it->second->find(r.process);
		if (p != it->second->end())
			r.bytes -= std::min(r.bytes, p->second);
	}
	return others;
}

// Each GPU of this machine the restore may use, with its free memory read now (NVML).
Result<std::vector<GpuInfo>> RestoreSession::gpus_with_free_memory()
{
	auto here = ask<std::vector<GpuInfo>>(driver_, kDriverGraceMs, "list the GPUs", [](Driver &d) { return d.gpus(); });
	if (!here)
		return std::move(here).error().context("%s", "list this machine's GPUs");
	for (GpuInfo &g : *here) {
		GpuUuid uuid = g.uuid;
		auto free = ask<uint64_t>(driver_, kDriverGraceMs, format("query the free memory of %s", uuid.str().c_str()),
					  [uuid](Driver &d) -> Result<uint64_t> { return d.free_bytes(uuid); });
		if (!free)
			return std::move(free).error();
		g.free_bytes = *free;
	}
	return here;
}

namespace {

// The free memory of each GPU less what restores in progress have reserved on it; note names them.
std::vector<GpuInfo> room_beside(std::vector<GpuInfo> gpus, const std::vector<GpuReservation> &others, std::string &note)
{
	std::map<GpuUuid, uint64_t> reserved;
	std::map<GpuUuid, std::set<pid_t>> owners;
	for (const GpuReservation &r : others) {
		uint64_t &sum = reserved[r.gpu]; // saturating: a ledger cannot wrap the check around
		sum = r.bytes > UINT64_MAX - sum ? UINT64_MAX : sum + r.bytes;
		owners[r.gpu].insert(r.owner);
	}
	for (GpuInfo &g : gpus) {
		auto it = reserved.find(g.uuid);
		if (!g.free_bytes || it == reserved.end())
			continue;
		g.free_bytes = it->second < g.free_bytes ? g.free_bytes - it->second : 1; // (0 would mean unknown)
		std::string pids;
		for (pid_t p : owners[g.uuid])
			pids += (pids.empty() ? "" : ", ") + std::to_string(p);
		note += format("%s%s of %s by CRIU pid(s) %s", note.empty() ? "" : "; ", human_bytes(it->second).c_str(),
			       g.uuid.str().c_str(), pids.c_str());
	}
	return gpus;
}

} // namespace

Result<std::vector<GpuPair>> RestoreSession::gpu_pairs()
{
	if (!image_ || image_->gpus.empty()) {
		if (!options_.device_map.empty())
			return make_error(EINVAL, "%s",
					  "a device map needs the GPU list of cuda-plugin.img, which this image lacks (it was "
					  "made by CRIU's own CUDA plugin or by a dump without GPU information)");
		return std::vector<GpuPair>();
	}
	// Restores started at once (replicas of one image) all see the free memory before any of them has
	// allocated: each also counts what the others have reserved, so that the one that does not fit is
	// refused here, by name, before any driver call, and the others run on. The free memory is read under
	// the ledger's lock: no reservation comes or goes between that read and the decision. A process's
	// reservation ends as soon as its driver restore returns; while the driver restores it, what it has
	// allocated so far is taken off its reservation (not_yet_allocated), so that it does not count twice.
	// While other restores are in their driver restores, the free memory is no measure: on the H200 the
	// fourth of 4 replicas of 24.2 GiB, on a GPU of 139.8 GiB, found room for 0.6 GiB beside the three others'
	// driver restores, what their processes held so far not coming off their reservations. So a restore
	// that does not fit beside restores in progress asks again (each attempt under the lock, none held in
	// between), going on as soon as it fits, and is refused only on what is left once they have ended, at
	// most its restore-timeout. Admitted restores never wait: no two can wait for each other.
	std::optional<GpuPlan> plan;
	std::vector<GpuInfo> machine = host_.machine_gpus();
	const uint64_t t0 = now_us();
	bool beside_others = false;
	uint64_t reserved = 0, allocated = 0; // by the others, and what of it their processes hold (NVML)
	const auto decide = [&](const std::vector<GpuReservation> &others) -> Result<std::vector<GpuReservation>> {
		beside_others = false;
		std::vector<GpuReservation> pending = not_yet_allocated(others);
		reserved = allocated = 0;
		for (size_t i = 0; i < others.size(); i++) {
			reserved += others[i].bytes;
			allocated += others[i].bytes - pending[i].bytes;
		}
		auto here = gpus_with_free_memory();
		if (!here)
			return std::move(here).error();
		std::string note;
		std::vector<GpuInfo> room = room_beside(std::move(*here), pending, note);
		auto p = plan_gpus(*image_, room, machine, options_.device_map);
		if (!p) {
			if (note.empty() || p.error().errno_value() != ENOSPC)
				return std::move(p).error();
			beside_others = true;
			return make_error(ENOSPC, "%s (the free memory counted is what is left after restores in progress on this "
						  "machine, which have reserved %s)",
					  p.error().message().c_str(), note.c_str());
		}
		if (!note.empty())
			LOG_INFO("restores in progress on this machine have reserved %s; this one fits beside them", note.c_str());
		// Each process's entry names it by its pid on this machine where it is known (its memory is then
		// told apart from the reservation by restores that come later), else by its pid in the image.
		std::map<pid_t, pid_t> here_pid;
		for (const auto &[pid, outcome] : outcomes_)
			here_pid[outcome.ns_pid] = pid;
		std::vector<GpuReservation> mine;
		reservation_keys_.clear();
		for (const auto &[process, gpus] : p->need_by_process) {
			pid_t key = here_pid.count(process) ? here_pid[process] : process;
			reservation_keys_[process] = key;
			for (const auto &[uuid, bytes] : gpus)
				mine.push_back({0, 0, uuid, bytes, key});
		}
		plan = std::move(*p);
		return mine;
	};
	auto held = host_.reserve_gpu_memory({options_.ledger, options_.ledger_timeout_ms}, decide);
	constexpr unsigned kPollMs = 100;
	bool waited = false;
	while (!held && beside_others && now_us() - t0 < uint64_t{options_.restore_timeout_ms} * 1000) {
		if (!waited)
			LOG_INFO("not enough free GPU memory now, beside restores in progress on this machine (of their %s "
				 "reserved, their processes hold %s so far, as the driver tells): waiting for them to end before "
				 "deciding (%s)", human_bytes(reserved).c_str(), human_bytes(allocated).c_str(),
				 held.error().message().c_str());
		waited = true;
		usleep(kPollMs * 1000);
		held = host_.reserve_gpu_memory({options_.ledger, options_.ledger_timeout_ms}, decide);
	}
	if (!held && waited)
		held = make_error(held.error().errno_value(), "%s; it waited %.1f s for the restores in progress to end",
				  held.error().message().c_str(), (now_us() - t0) / 1e6);
	if (!held)
		return std::move(held).error().context("%s", "cannot restore the image's GPU state on this machine");
	reservations_ = std::move(*held);
	if (!plan->pairs.empty())
		LOG_INFO("restoring with GPU pairs: %s", plan->description.c_str());
	return plan->pairs;
}

Status RestoreSession::load_driver(pid_t pid)
{
	if (driver_)
		return {};
	uint64_t t0 = now_us();
	auto d = call_within<Driver *>(kDriverLoadTimeoutMs, "load the CUDA driver (cuInit)", driver_source_);
	restore_cost_.load_us += now_us() - t0;
	if (!d)
		return std::move(d).error().context("restore GPU state of pid %d", pid);
	driver_ = std::make_shared<TimedDriver>(**d);
	return {};
}

namespace {

std::vector<pid_t> pids_of(const std::vector<ProcJob> &jobs)
{
	std::vector<pid_t> pids;
	pids.reserve(jobs.size());
	for (const ProcJob &j : jobs)
		pids.push_back(j.pid);
	return pids;
}

} // namespace

// Records the failure of each of pids and logs it, once, here where it is decided: the hook only refers
// to it. shared: one error of the whole batch (no GPU plan, a damaged GPU image), which does not name
// the processes; the log line names them.
void RestoreSession::failed(const std::vector<pid_t> &pids, const Error &e, bool shared)
{
	for (pid_t pid : pids)
		outcomes_[pid].error = e;
	if (!shared) {
		LOG_ERROR("%s", e.message().c_str());
		return;
	}
	std::string names;
	for (pid_t pid : pids)
		names += format("%s%d", names.empty() ? "" : ", ", pid);
	LOG_ERROR("restore pid%s %s: %s", pids.size() > 1 ? "s" : "", names.c_str(), e.message().c_str());
}

// Which candidates are CUDA processes: libcuda mapped (no driver call) and a restore thread. Each one
// found gets an outcome and a job with its restore thread (the restore call is set later).
std::vector<ProcJob> RestoreSession::find_cuda_processes(const std::vector<pid_t> &candidates)
{
	std::set<pid_t> in_image;
	if (image_)
		for (const ProcessRecord &p : image_->processes)
			in_image.insert(p.ns_pid);
	std::vector<ProcJob> found;
	for (pid_t pid : candidates) {
		if (seen_.count(pid))
			continue;
		seen_[pid] = false;
		TaskInfo info = host_.task_info(pid);
		bool expected = in_image.count(info.ns_pid) > 0;
		if (!expected && !host_.uses_libcuda(pid))
			continue;
		if (expected) // from here on, if CRIU dies, the guard kills pid
			guard_.restoring(pid);
		if (auto st = load_driver(pid); !st) {
			seen_[pid] = true;
			failed({pid}, std::move(st).error());
			continue;
		}
		auto tid = ask<pid_t>(driver_, kDriverGraceMs, format("query the restore thread of pid %d", pid),
				      [pid](Driver &d) { return d.restore_thread_id(pid); });
		if (!tid) {
			if (expected || tid.error().errno_value() == ETIMEDOUT) {
				seen_[pid] = true;
				failed({pid}, std::move(tid).error().context("restore pid %d", pid));
			}
			continue;
		}
		seen_[pid] = true;
		if (!expected)
			guard_.restoring(pid);
		outcomes_[pid].ns_pid = info.ns_pid;
		found.push_back({pid, *tid, format("restore pid %d", pid), {}});
	}
	return found;
}

void RestoreSession::restore_batch(const std::vector<pid_t> &candidates)
{
	// First: until then a first touch of decoded memory CRIU registered would wait for nobody.
	std::set<pid_t> lazy = load_gpu_.attach_lazy ? load_gpu_.attach_lazy() : std::set<pid_t>();
	std::shared_future<Status> checked;
	std::vector<ProcJob> jobs = find_cuda_processes(candidates);
	if (!jobs.empty()) {
		auto pairs = gpu_pairs();
		if (!pairs) {
			// Refused before any restore call: every process is still stopped, none runs without its state.
			failed(pids_of(jobs), pairs.error(), true);
			jobs.clear();
		}
		// Each process's chunks: handled before the driver's restore (written, or read back from CRIU's
		// pages), or mapped by CRIU and checked by check_mapped, which gates its unlock.
		std::vector<GpuLoadTarget> handled_before_restore, mapped_by_criu;
		for (const ProcJob &j : jobs) {
			GpuLoadTarget t{j.pid, outcomes_[j.pid].ns_pid};
			bool is_mapped = load_gpu_ && load_gpu_.check_mapped && !load_gpu_.handled_before_restore(t.ns_pid);
			(is_mapped ? mapped_by_criu : handled_before_restore).push_back(t);
		}
		if (load_gpu_ && !handled_before_restore.empty() && !jobs.empty()) {
			// A damaged image is refused with every process still stopped, before any driver call.
			uint64_t t0 = now_us();
			Status st = load_gpu_(handled_before_restore);
			load_gpu_us_ += now_us() - t0;
			if (!st) {
				failed(pids_of(jobs), st.error(), true);
				jobs.clear();
			}
		}
		if (!mapped_by_criu.empty() && !jobs.empty()) {
			start_check([] {}); // a CRIU without POST_FORKING: at the latest now
			checked = mapped_checked_;
			mapped_check_ready_before_driver_ =
				checked.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
			if (mapped_check_ready_before_driver_ && !checked.get()) {
				failed(pids_of(jobs), checked.get().error(), true); // before any driver call
				jobs.clear();
			}
			size_t wait = std::count_if(mapped_by_criu.begin(), mapped_by_criu.end(), [&](const GpuLoadTarget &t) {
				return load_gpu_.decoded && load_gpu_.decoded(t.ns_pid) && !lazy.count(t.ns_pid);
			});
			if (!mapped_check_ready_before_driver_ && !lazy.empty())
				LOG_INFO("the GPU image CRIU maps: still being read; the driver restores %zu process(es) while their "
					 "compressed GPU state is decoded, in the order it reads it",
					 lazy.size());
			if (!mapped_check_ready_before_driver_ && wait)
				LOG_INFO("the GPU image CRIU maps: still being read; the driver restores %zu process(es) once their "
					 "compressed GPU state is decoded, and unlocks none before the whole image has passed",
					 wait);
			else if (!mapped_check_ready_before_driver_)
				LOG_INFO("%s", "the GPU image CRIU maps: its check runs on while the driver restores; no process is "
					       "unlocked before it has passed");
			else if (!jobs.empty())
				LOG_INFO("the GPU image CRIU maps: checked in %s, while CRIU restored memory",
					 seconds(mapped_check_us_->load()).c_str());
		}
		for (ProcJob &j : jobs) {
			pid_t ns_pid = outcomes_[j.pid].ns_pid;
			bool decoded = load_gpu_.decoded && load_gpu_.decoded(ns_pid);
			bool whole_first = decoded && !lazy.count(ns_pid); // else each chunk is waited for on its first touch
			pid_t key = reservation_keys_.count(ns_pid) ? reservation_keys_[ns_pid] : ns_pid;
			j.call = [pid = j.pid, p = *pairs, checked, held = reservations_, ns_pid, key, decoded, whole_first,
				  release = load_gpu_.release_decoded](Driver &d) -> Status {
				// The driver reads memory CRIU maps from what the check decodes: only once it is whole.
				if (whole_first && checked.valid())
					if (Status st = checked.get(); !st)
						return st;
				Status st = d.restore(pid, p);
				if (held) // what it allocated shows in the free memory now
					held->settle(key);
				if (st && checked.valid()) // the process stays locked until its chunks have passed
					st = checked.get();
				if (st && decoded) // the decode is over: no longer written
					release(ns_pid, pid);
				if (st)
					st = d.unlock(pid);
				return st;
			};
		}
	}
	auto stop_ahead = std::make_shared<std::atomic<bool>>(false);
	std::thread ahead = read_file_pages_ahead(jobs, checked, stop_ahead);
	if (!jobs.empty())
		restore_all(std::move(jobs));
	*stop_ahead = true; // what it has asked for is read on; the processes are not held up for the rest
	if (ahead.joinable())
		ahead.join();
	if (reservations_) // what it restored now shows in the GPUs' free memory
		std::exchange(reservations_, nullptr)->release();
	if (checked.valid())
		checked.wait(); // its time for the summary, when a restore failed before it
	if (image_)
		report_missing();
}

// The pages of their mapped files the processes used at dump (the image's file_pages), asked of the kernel
// on a thread of its own while the driver restores, once the GPU image is read (the disk has nothing else
// to do then; before, these reads would delay the GPU state): their first work after a restore from a
// cold page cache then finds its libraries' code and data in memory. A hint: at most a quarter of the
// memory available, asked for until the driver's restores are done (stop).
std::thread RestoreSession::read_file_pages_ahead(const std::vector<ProcJob> &jobs, const std::shared_future<Status> &checked,
						  const std::shared_ptr<std::atomic<bool>> &stop)
{
	std::vector<std::pair<pid_t, std::vector<MemoryRange>>> wanted;
	uint64_t bytes = 0;
	for (const ProcJob &j : jobs)
		if (image_)
			for (const ProcessRecord &r : image_->processes)
				if (r.ns_pid == outcomes_[j.pid].ns_pid && !r.file_pages.empty()) {
					wanted.emplace_back(j.pid, r.file_pages);
					bytes += total_bytes(r.file_pages);
				}
	if (wanted.empty())
		return {};
	auto avail = host_.available_memory();
	uint64_t budget = avail ? *avail / 4 : bytes;
	try {
		return own_thread([this, wanted = std::move(wanted), checked, budget, stop, bytes] {
			if (checked.valid())
				while (checked.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready && !*stop) {
				}
			uint64_t t0 = now_us(), asked = 0;
			for (const auto &[pid, ranges] : wanted)
				if (asked < budget && !*stop)
					asked += host_.read_file_pages_ahead(pid, ranges, budget - asked, *stop);
			LOG_INFO("read ahead %s of the %s of files the process(es) had mapped and used, asked in %s while "
				 "the driver restores",
				 human_bytes(asked).c_str(), human_bytes(bytes).c_str(), seconds(now_us() - t0).c_str());
		});
	} catch (const std::system_error &) {
		return {};
	}
}

// The restore's progress: what each process's checkpoint held (the image) against the GPU memory it
// holds again (NVML, asked once per look at all processes).
PhaseProgress RestoreSession::restore_progress(const std::vector<pid_t> &pids)
{
	PhaseProgress progress{"restore", {}, {}, options_.stall_timeout_ms};
	// On r580 NVML shows a restoring process's GPU memory only once its restore is done, and the driver's
	// restore thread may wait on the GPU's copies without using CPU time: a restore is declared stalled
	// only once its bytes have been seen to move.
	progress.stall_needs_bytes = true;
	for (pid_t pid : pids) {
		uint64_t expected = 0;
		if (image_)
			for (const ProcessRecord &r : image_->processes)
				if (r.ns_pid == outcomes_[pid].ns_pid)
					expected = r.state_bytes;
		progress.expected.push_back(expected);
	}
	struct Looked {
		uint64_t at_us = 0;
		std::map<pid_t, uint64_t> bytes;
	};
	auto looked = std::make_shared<Looked>();
	progress.bytes = [driver = driver_, pids, looked](size_t i) -> uint64_t {
		if (now_us() > looked->at_us + 200000) {
			looked->at_us = now_us();
			auto m = ask<std::map<pid_t, uint64_t>>(driver, 2000, "ask NVML for the GPU memory of each process",
								[](Driver &d) -> Result<std::map<pid_t, uint64_t>> {
									if (auto m = d.gpu_bytes_by_process())
										return std::move(*m);
									return std::map<pid_t, uint64_t>();
								});
			looked->bytes = m ? std::move(*m) : std::map<pid_t, uint64_t>();
		}
		auto it = looked->bytes.find(pids[i]);
		return it == looked->bytes.end() ? 0 : it->second;
	};
	return progress;
}

void RestoreSession::restore_all(std::vector<ProcJob> jobs)
{
	LOG_INFO("restoring %zu CUDA process(es)%s", jobs.size(), jobs.size() > 1 ? " in parallel" : "");
	std::vector<pid_t> pids = pids_of(jobs);
	PhaseProgress progress = restore_progress(pids);
	uint64_t t0 = now_us();
	std::vector<ProcResult> results = run_proc_jobs(host_, driver_, std::move(jobs), options_.parallel,
							options_.restore_timeout_ms, &progress);
	device_phase_us_ += now_us() - t0;
	for (size_t i = 0; i < pids.size(); i++) {
		outcomes_[pids[i]].restore_us = results[i].us;
		if (results[i].status)
			guard_.restored(pids[i]);
		else
			failed({pids[i]}, std::move(results[i].status).error());
	}
}

void RestoreSession::report_missing()
{
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
		LOG_WARN("%zu more processes of the image were not found among the restored tasks yet", missing - kNamed);
}

Result<bool> RestoreSession::resume(pid_t pid)
{
	if (!seen_.count(pid)) {
		PhaseClock clock;
		size_t before = outcomes_.size();
		std::vector<pid_t> candidates = host_.stopped_tasks();
		if (std::find(candidates.begin(), candidates.end(), pid) == candidates.end())
			candidates.push_back(pid);
		restore_batch(candidates);
		clock.charge(restore_cost_, driver_.get(), static_cast<unsigned>(outcomes_.size() - before));
		kill_if_criu_ignores_failure(candidates);
	}
	auto it = outcomes_.find(pid);
	if (it == outcomes_.end())
		return false;
	if (it->second.error)
		return *it->second.error;
	return true;
}

void RestoreSession::abandon(pid_t pid, const Error &e)
{
	seen_[pid] = true;
	if (!outcomes_[pid].error)
		outcomes_[pid].error = e;
	std::vector<pid_t> candidates = host_.stopped_tasks();
	if (std::find(candidates.begin(), candidates.end(), pid) == candidates.end())
		candidates.push_back(pid);
	kill_if_criu_ignores_failure(candidates);
}

void RestoreSession::kill_if_criu_ignores_failure(const std::vector<pid_t> &candidates)
{
	if (!any_failed() || criu_fails_on_error_ || killed_)
		return;
	// This CRIU would report success anyway: make sure no process runs without its GPU state.
	killed_ = true;
	LOG_ERROR("GPU state could not be restored; this CRIU does not fail a restore for that, so the "
		  "restored processes are killed now (apply criu-patches/ to make criu restore fail instead)");
	for (pid_t p : candidates)
		host_.kill(p);
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
		      "load %s; plugin's own time beyond the driver: %s%s%s",
		      outcomes_.size(), failed, seconds(device_phase_us_).c_str(), seconds(restore_cost_.load_us).c_str(),
		      restore_cost_.per_process().c_str(),
		      load_gpu_ ? format("; GPU image checked in %s%s", seconds(load_gpu_us_ + mapped_check_us_->load()).c_str(),
					 !mapped_checked_.valid()             ? ""
					 : mapped_check_ready_before_driver_ ? " (what CRIU maps: while CRIU restored memory)"
									     : " (what CRIU maps: from CRIU's restore of memory into "
									       "the driver's restore)")
					  .c_str()
				: "",
		      image_ ? "" : " [image of CRIU's own cuda plugin: no cuda-plugin.img]");
}

} // namespace cuda_criu
