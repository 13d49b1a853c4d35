#include "core/dump_session.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <ctime>
#include <set>
#include <system_error>
#include <thread>

#include "base/format.h"
#include "base/log.h"
#include "base/text.h"
#include "core/dump_preflight.h"
#include "core/dump_refusals.h"
#include "core/gpu_store.h"
#include "image/image.h"
#include "os/fs_context.h"

#ifndef CUDA_CRIU_VERSION
#define CUDA_CRIU_VERSION "dev"
#endif

namespace cuda_criu {

namespace {

// CRIU's SIGALRM handler BUG()s five seconds after its seize alarm fires, and the alarm's first signal
// already fails the seize: every wait of a pause ends this long before the alarm.
constexpr unsigned kAlarmMarginMs = 1000;

} // namespace

DumpSession::DumpSession(Options options, Host &host, DriverSource driver, GuardSource guard, AlarmClock alarm,
			 int image_dir_fd)
	: options_(std::move(options)), host_(host), driver_source_(std::move(driver)), guard_source_(std::move(guard)),
	  alarm_(std::move(alarm)), image_dir_fd_(image_dir_fd)
{
}

// The time a pause may still wait, in ms (0: no limit). CRIU arms its seize alarm once for all pauses
// of a dump: what it leaves is the budget of every wait to come, driver load included.
Result<unsigned> DumpSession::pause_budget_ms(pid_t pid) const
{
	unsigned left = alarm_ ? alarm_() : 0;
	if (left == 0)
		return 0u;
	if (left <= kAlarmMarginMs)
		return make_error(ETIMEDOUT,
				  "pid %d: CRIU's seize timeout is all but spent (%u ms left) before its GPU state could be "
				  "locked: raise criu dump --timeout",
				  pid, left);
	return left - kAlarmMarginMs;
}

Status DumpSession::load_driver(unsigned budget_ms)
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
	unsigned limit = budget_ms ? std::min(budget_ms, kDriverLoadTimeoutMs) : kDriverLoadTimeoutMs;
	auto d = call_within<Driver *>(limit, "load the CUDA driver (cuInit)", driver_source_);
	pause_cost_.load_us += now_us() - t0;
	if (!d)
		return std::move(d).error();
	driver_ = std::make_shared<TimedDriver>(**d);
	return {};
}

Result<bool> DumpSession::pause(pid_t pid)
{
	if (!first_pid_)
		first_pid_ = pid; // CRIU pauses the root of the tree first
	if (!host_.uses_libcuda(pid))
		return false;
	if (std::any_of(procs_.begin(), procs_.end(), [&](const Proc &p) { return p.pid == pid; })) {
		LOG_DEBUG("pid %d is paused already", pid); // CRIU retried its seize
		return true;
	}
	PhaseClock clock;
	uint64_t deadline = 0;
	auto budget = pause_budget_ms(pid);
	if (!budget)
		return std::move(budget).error();
	if (*budget)
		deadline = now_us() + *budget * 1000ULL;
	Result<bool> r = false;
	if (auto st = load_driver(*budget); !st)
		r = std::move(st).error().context("pid %d uses CUDA, but its GPU state cannot be saved", pid);
	else
		r = pause_cuda(pid, deadline);
	if (!r && deadline && r.error().errno_value() == ETIMEDOUT)
		return std::move(r).error().context(
			"%s", "the pause ran into CRIU's seize timeout (raise criu dump --timeout, or lower the lock "
			      "timeout, CUDA_CRIU_LOCK_TIMEOUT, below it)");
	if (r && *r)
		clock.charge(pause_cost_, driver_.get(), 1);
	return r;
}

namespace {

// A wait's limit in ms: cap_ms (0: none), cut to what is left before deadline_us (0: none).
unsigned limit_ms(uint64_t deadline_us, unsigned cap_ms)
{
	if (!deadline_us)
		return cap_ms;
	uint64_t now = now_us();
	auto left = static_cast<unsigned>(deadline_us > now + 1000 ? (deadline_us - now) / 1000 : 1);
	return cap_ms ? std::min(cap_ms, left) : left;
}

} // namespace

Result<bool> DumpSession::pause_cuda(pid_t pid, uint64_t deadline)
{
	TaskInfo info = host_.task_info(pid);
	if (info.stopped)
		// A CUDA process's restore thread is stopped with it: every driver call on it, the first query
		// included, would wait for it until a timeout.
		return make_error(EBUSY,
				  "pid %d is stopped (SIGSTOP or a terminal stop) and has libcuda loaded: the driver cannot "
				  "lock a CUDA process while it is stopped; continue it (kill -CONT %d) and dump again "
				  "(criu dump --leave-stopped leaves it stopped after the dump)",
				  pid, pid);
	auto tid = ask<pid_t>(driver_, limit_ms(deadline, kDriverGraceMs), format("query the restore thread of pid %d", pid),
			      [pid](Driver &d) { return d.restore_thread_id(pid); });
	if (!tid && tid.error().errno_value() == kNoCudaState) {
		// libcuda is loaded but no CUDA context exists (a worker forked from a CUDA process, or one that
		// imported a CUDA library). Its device files, if any, are judged now, while its CUDA ancestors
		// still hold theirs.
		std::vector<std::pair<pid_t, std::vector<DeviceFd>>> cuda_fds;
		for (const Proc &p : procs_)
			cuda_fds.emplace_back(p.pid, p.device_fds);
		no_cuda_state_[pid] = not_inherited(host_, pid, cuda_fds);
		LOG_INFO("pid %d has libcuda loaded but no CUDA state to save (%s); dumping it as a plain process",
			 pid, tid.error().message().c_str());
		return false;
	}
	if (!tid && tid.error().errno_value() == ETIMEDOUT)
		return std::move(tid).error();
	if (!tid)
		return std::move(tid).error().context(
			"pid %d has libcuda loaded, but the driver cannot say whether it holds CUDA state, so it is not "
			"dumped without it (check the process and the driver with nvidia-smi)",
			pid);
	// What the driver would checkpoint into an image that cannot restore is refused before any lock.
	std::vector<DeviceFd> device_fds = host_.nvidia_device_files(pid).fds;
	if (auto st = refuse_streamed(host_, pid); !st)
		return std::move(st).error();
	if (auto st = refuse_shared_handles(host_, pid, device_fds); !st)
		return std::move(st).error();
	if (auto st = refuse_legacy_ipc(host_, pid); !st) // reads the machine's maps only for a cuda.shm file
		return std::move(st).error();
	auto state = ask<CudaState>(driver_, limit_ms(deadline, kDriverGraceMs), format("query the CUDA state of pid %d", pid),
				    [pid](Driver &d) { return d.state(pid); });
	if (!state)
		return std::move(state).error().context("pid %d", pid);
	Proc p;
	p.pid = pid;
	p.restore_tid = *tid;
	p.initial = *state;
	p.device_fds = std::move(device_fds);
	p.ns_pid = info.ns_pid;
	p.rss_before = info.rss_bytes;
	note_gpus(p, info, deadline);
	if (!preflight_done_) { // before the first lock, for the whole tree
		preflight_done_ = true;
		gpu_memory_ = tree_gpu_memory(driver_, limit_ms(deadline, kDriverGraceMs));
		if (auto st = preflight_memory(options_, host_, first_pid_, gpu_memory_); !st)
			return std::move(st).error();
		if (auto st = preflight_space(options_, host_, first_pid_, image_dir_fd_, gpu_memory_); !st)
			return std::move(st).error();
	}
	if (auto it = gpu_memory_.bytes.find(pid); it != gpu_memory_.bytes.end())
		p.gpu_bytes = it->second;

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
	case CudaState::Running:
		guard_.watch(pid, CudaState::Running);
		if (auto st = lock(p, deadline); !st)
			return std::move(st).error();
		break;
	}
	LOG_DEBUG("pid %d: %s, restore thread %d, %zu GPU(s); lock %.1f ms", pid, to_string(p.initial), p.restore_tid,
		  p.gpu_uuids.size(), p.lock_us / 1000.0);
	procs_.push_back(std::move(p));
	return true;
}

Status DumpSession::stand_ins_allowed(pid_t pid) const
{
	if (auto it = no_cuda_state_.find(pid); it != no_cuda_state_.end()) {
		if (it->second)
			return *it->second;
		return refuse_streamed(host_, pid);
	}
	bool cuda = std::any_of(procs_.begin(), procs_.end(), [&](const Proc &p) { return p.pid == pid; });
	return stand_ins_refused(pid, cuda);
}

// The GPUs the process holds: those whose device nodes it has open, narrowed to those it has a CUDA
// context on when NVML tells (a framework may open every GPU's node and use one: JAX under
// CUDA_VISIBLE_DEVICES=0 holds /dev/nvidia1 too). The nodes in its /dev are the GPUs its driver knew.
void DumpSession::note_gpus(Proc &p, const TaskInfo &info, uint64_t deadline)
{
	if (!gpus_listed_) { // once per dump, whatever the answers
		gpus_listed_ = true;
		if (auto gpus = ask<std::vector<GpuInfo>>(driver_, limit_ms(deadline, kDriverGraceMs), "list the GPUs",
							  [](Driver &d) { return d.gpus(); }))
			machine_gpus_ = std::move(*gpus);
		kernel_gpus_ = host_.machine_gpus();
		if (auto c = ask<std::map<pid_t, std::vector<GpuUuid>>>(
			    driver_, limit_ms(deadline, kDriverGraceMs), "ask NVML which GPUs each process uses",
			    [](Driver &d) -> Result<std::map<pid_t, std::vector<GpuUuid>>> {
				    if (auto m = d.gpus_by_process())
					    return std::move(*m);
				    return make_error(ENOSYS, "%s", "NVML cannot tell");
			    }))
			contexts_ = std::move(*c);
	}
	auto uuid_of = [&](unsigned minor) -> std::optional<GpuUuid> {
		for (const GpuInfo &g : kernel_gpus_)
			if (g.ordinal == static_cast<int>(minor))
				return g.uuid;
		if (kernel_gpus_.empty() && minor < machine_gpus_.size()) // no /proc/driver/nvidia: minors follow ordinals
			return machine_gpus_[minor].uuid;
		return std::nullopt;
	};
	std::vector<GpuUuid> open;
	for (unsigned minor : info.nvidia_minors)
		if (auto uuid = uuid_of(minor))
			open.push_back(*uuid);
	for (unsigned minor : host_.dev_gpu_minors(p.pid))
		if (auto uuid = uuid_of(minor))
			p.reachable_gpus.push_back(*uuid);
	if (!p.reachable_gpus.empty()) // a node it has open counts as known even if its /dev lacks it
		p.reachable_gpus.insert(p.reachable_gpus.end(), open.begin(), open.end());
	auto ctx = contexts_.find(p.pid);
	for (const GpuUuid &u : open)
		if (ctx == contexts_.end() || std::find(ctx->second.begin(), ctx->second.end(), u) != ctx->second.end())
			p.gpu_uuids.push_back(u);
	if (ctx != contexts_.end())
		LOG_DEBUG("pid %d: %zu GPU node(s) open, a CUDA context on %zu of them (NVML)", p.pid, open.size(),
			  p.gpu_uuids.size());
	if (p.gpu_uuids.empty()) // NVML knows it by another pid (another pid namespace): its nodes say it all
		p.gpu_uuids = std::move(open);
}

Status DumpSession::lock(Proc &p, uint64_t deadline)
{
	pid_t pid = p.pid;
	unsigned lock_ms = options_.lock_timeout_ms;
	// The driver honours the lock timeout itself; the job's own limit only guards against a driver that
	// does not return at all. Under CRIU's seize alarm both shrink to what the alarm leaves.
	unsigned cap = lock_ms ? lock_ms + kDriverGraceMs : 0;
	unsigned limit = limit_ms(deadline, cap);
	bool cut = limit != cap;
	if (cut)
		lock_ms = limit - std::min(kDriverGraceMs, limit / 4);
	uint64_t t0 = now_us();
	Status st = call_within<void>(limit, format("lock pid %d", pid),
				      [d = driver_, pid, lock_ms]() -> Status {
					      if (auto st = d->lock(pid, lock_ms); !st)
						      return std::move(st).error().context("lock pid %d", pid);
					      return {};
				      });
	p.lock_us = now_us() - t0;
	if (st) {
		p.locked_by_us = true;
		return {};
	}
	Error err = std::move(st).error();
	if (err.errno_value() == ETIMEDOUT && !cut)
		err = std::move(err).context("%s", format("CUDA work in flight did not finish within the lock "
							 "timeout of %.1f s (raise CUDA_CRIU_LOCK_TIMEOUT)",
							 options_.lock_timeout_ms / 1000.0)
							  .c_str());
	// A lock that failed half way must not leave the process blocked. Under CRIU's alarm this may use
	// half of the margin kept before it.
	uint64_t undo_deadline = deadline ? deadline + kAlarmMarginMs * 500ULL : 0;
	if (state_now(pid, limit_ms(undo_deadline, kDriverGraceMs)) == to_string(CudaState::Locked))
		(void)ask<void>(driver_, limit_ms(undo_deadline, kDriverGraceMs), format("unlock pid %d", pid),
				[pid](Driver &d) { return d.unlock(pid); });
	return err;
}

// The process's CUDA state as the driver tells it now, or "unknown".
std::string DumpSession::state_now(pid_t pid, unsigned timeout_ms)
{
	auto s = ask<CudaState>(driver_, timeout_ms, format("query the CUDA state of pid %d", pid),
				[pid](Driver &d) { return d.state(pid); });
	return s ? to_string(*s) : "unknown";
}

Status DumpSession::checkpoint_all()
{
	std::vector<ProcJob> jobs;
	std::vector<Proc *> targets;
	for (Proc &p : procs_) {
		if (p.initial == CudaState::Checkpointed)
			continue;
		targets.push_back(&p);
		pid_t pid = p.pid;
		jobs.push_back({pid, p.restore_tid, format("checkpoint pid %d", pid),
				[pid](Driver &d) { return d.checkpoint(pid); }});
	}
	if (targets.empty())
		return {};
	LOG_INFO("checkpointing %zu CUDA process(es)%s", targets.size(), targets.size() > 1 ? " in parallel" : "");
	auto policy = buffer_policy();
	buffer_traced_ = policy.has_value();
	for (ProcJob &j : jobs)
		j.buffer = policy;
	// The driver copies the GPU memory into the process: its growth is the copy's progress.
	PhaseProgress progress{"checkpoint", {}, {}, options_.stall_timeout_ms};
	std::vector<std::pair<pid_t, uint64_t>> before;
	// The memory map before and after (read here, on CRIU's thread, the process stopped but for its
	// restore thread): what the checkpoint mapped anew is the driver's copy (core/mapped_restore.h).
	std::vector<std::vector<Mapping>> maps_before;
	for (Proc *p : targets) {
		progress.expected.push_back(p->gpu_bytes);
		before.emplace_back(p->pid, p->rss_before);
		maps_before.push_back(host_.memory_map(p->pid));
	}
	progress.bytes = [this, before](size_t i) {
		uint64_t rss = host_.task_info(before[i].first).rss_bytes;
		return rss > before[i].second ? rss - before[i].second : 0;
	};
	// Meanwhile, which pages of its mapped files each process uses, for the restore to read ahead
	// (os/file_pages.h): the dump's share of the image's room for them each.
	std::vector<std::vector<MemoryRange>> file_pages(targets.size());
	std::thread note_file_pages;
	try {
		note_file_pages = own_thread([&] {
			for (size_t i = 0; i < targets.size(); i++)
				file_pages[i] = host_.mapped_file_pages(targets[i]->pid, maps_before[i],
									std::max<size_t>(1, kImageMaxFilePageRanges / targets.size()));
		});
	} catch (const std::system_error &) {
		LOG_DEBUG("%s", "no thread to note the processes' mapped files' pages: the restore will not read them ahead");
	}
	uint64_t t0 = now_us();
	std::vector<ProcResult> results = run_proc_jobs(host_, driver_, std::move(jobs), options_.parallel,
							options_.checkpoint_timeout_ms, &progress);
	device_phase_us_ = now_us() - t0;
	if (note_file_pages.joinable())
		note_file_pages.join();
	Status first_failure;
	for (size_t i = 0; i < targets.size(); i++) {
		targets[i]->file_pages = std::move(file_pages[i]);
		LOG_DEBUG("pid %d: %s of its mapped files in use, in %zu range(s), for the restore to read ahead",
			  targets[i]->pid, human_bytes(total_bytes(targets[i]->file_pages)).c_str(),
			  targets[i]->file_pages.size());
		if (results[i].status)
			targets[i]->checkpoint_ranges = added_private_anon(maps_before[i], host_.memory_map(targets[i]->pid));
		record_checkpoint(*targets[i], std::move(results[i]), first_failure);
	}
	return first_failure;
}

// What the checkpoint's jobs do with the driver's buffer (os/checkpoint_buffer.h), said once per dump.
std::optional<BufferPolicy> DumpSession::buffer_policy()
{
	if (!options_.huge_pages || !kCanPrepareBuffer) {
		LOG_INFO("%s: the driver's checkpoint buffer is left to the driver",
			 options_.huge_pages ? "not on this architecture" : "huge-pages off");
		return std::nullopt;
	}
	BufferPolicy policy;
	auto mode = host_.thp_mode();
	if (!mode || *mode == "never") {
		policy.huge_pages = false;
		LOG_INFO("the driver's checkpoint buffer stays on 4 KiB pages (%s), populated by %u threads",
			 mode ? "transparent huge pages are never on this host" : mode.error().message().c_str(),
			 policy.threads);
	}
	return policy;
}

void DumpSession::log_buffer(pid_t pid, const BufferReport &r, uint64_t call_us)
{
	if (!r.mappings) {
		LOG_INFO("pid %d: the driver mapped no populated checkpoint buffer the plugin knows; its checkpoint "
			 "ran as the driver does it",
			 pid);
		return;
	}
	double s = static_cast<double>(r.populate_us) / 1e6;
	LOG_INFO("pid %d: the driver's checkpoint buffer (%s) on %s, populated in %.2f s (%.1f GB/s); the call "
		 "took %.2f s",
		 pid, human_bytes(r.bytes).c_str(), buffer_pages(r).c_str(), s,
		 s > 0 ? static_cast<double>(r.bytes) / 1e9 / s : 0.0, static_cast<double>(call_us) / 1e6);
	if (!r.problem.empty())
		LOG_WARN("pid %d: %s; the driver touched the rest of its buffer itself", pid, r.problem.c_str());
}

void DumpSession::record_checkpoint(Proc &p, ProcResult result, Status &first_failure)
{
	p.checkpoint_us = result.us;
	if (result.status && buffer_traced_)
		log_buffer(p.pid, result.buffer, result.us);
	if (result.status) {
		p.checkpointed_by_us = true;
		uint64_t rss = host_.task_info(p.pid).rss_bytes;
		p.state_bytes = rss > p.rss_before ? rss - p.rss_before : 0;
		LOG_DEBUG("pid %d: the checkpoint mapped %s of new memory in %zu range(s)", p.pid,
			  human_bytes(total_bytes(p.checkpoint_ranges)).c_str(), p.checkpoint_ranges.size());
		// Its restore thread not stopped as CRIU left it: CRIU's copy of the process cannot be trusted.
		// Logged by run_proc_jobs; the dump fails and the rollback restores it.
		if (result.thread_error && first_failure)
			first_failure = *result.thread_error;
		return;
	}
	// A failed checkpoint may still have moved the state: the job asked while the restore thread ran (a
	// query now, with the thread stopped, would block). A timed-out call is still running: unknown.
	if (result.state_after_failure == CudaState::Checkpointed)
		p.checkpointed_by_us = true;
	p.checkpoint_error = std::move(result.status).error();
	LOG_ERROR("%s", p.checkpoint_error->message().c_str());
	if (first_failure)
		first_failure = *p.checkpoint_error;
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
		PhaseClock clock;
		Status st = checkpoint_all();
		clock.charge(checkpoint_cost_, driver_.get(), static_cast<unsigned>(procs_.size()));
		if (!st)
			return make_error(st.error().errno_value(), "%s", "checkpoint of the CUDA processes failed (see above)");
	}
	if (it->checkpoint_error)
		return make_error(it->checkpoint_error->errno_value(), "checkpoint of pid %d failed (see above)", pid);
	return true;
}

std::vector<GpuSaveTarget> DumpSession::gpu_save_targets(uint64_t *bytes) const
{
	std::vector<GpuSaveTarget> targets;
	*bytes = 0;
	for (const Proc &p : procs_)
		if (p.checkpointed_by_us && !p.checkpoint_ranges.empty()) {
			targets.push_back({p.pid, p.ns_pid, p.checkpoint_ranges});
			*bytes += total_bytes(p.checkpoint_ranges);
		}
	return targets;
}

Status DumpSession::store_gpu_image(int dir_fd, const SkipPages &skip)
{
	auto own = leave_gpu_state_out(dir_fd, skip);
	if (!own)
		return std::move(own).error();
	return *own ? write_gpu_image() : Status{};
}

Result<bool> DumpSession::leave_gpu_state_out(int dir_fd, const SkipPages &skip)
{
	uint64_t bytes = 0;
	std::vector<GpuSaveTarget> targets = gpu_save_targets(&bytes);
	if (targets.empty())
		return false;
	unsigned threads = gpu_io_threads(options_.io_threads, bytes);
	// CRIU's pages images keep the GPU state: the plugin still records a checksum of every chunk, which the
	// restore checks over the memory CRIU restored, before the driver's restore.
	auto keep_in_criu = [&](const char *why) -> Status {
		LOG_INFO("the GPU state stays in CRIU's pages images: %s", why);
		std::string id = new_gpu_image_id();
		auto index = checksum_gpu_state(host_, targets, id, threads);
		if (!index)
			return std::move(index).error().context("%s", "cannot record the GPU state's checksums (the dump fails; "
								      "every process is returned to its state)");
		gpu_image_dir_fd_ = dir_fd;
		if (auto st = write_gpu_index(dir_fd, *index); !st)
			return std::move(st).error().context("%s", "cannot record the GPU state's checksums");
		gpu_checksums_id_ = id;
		gpu_image_note_ = format("GPU state in CRIU's pages images (%s), its checksums taken in %s", why,
					 seconds(index->write_us).c_str());
		return {};
	};
	auto kept_in_criu = [&](const char *why) -> Result<bool> {
		if (Status st = keep_in_criu(why); !st)
			return std::move(st).error();
		return false;
	};
	if (options_.gpu_image == GpuImage::Criu)
		return kept_in_criu("gpu-image=criu");
	if (!skip)
		return kept_in_criu("this CRIU cannot leave pages to a plugin; criu-patches/0004 adds that");
	// The first request tells whether this dump can leave pages out at all; the rest must then succeed.
	bool first = true;
	for (const GpuSaveTarget &t : targets)
		for (const MemoryRange &r : t.ranges) {
			int rc = skip(t.pid, r.start, r.end);
			if (rc == -EOPNOTSUPP && first)
				return kept_in_criu("this dump cannot leave pages out (lazy pages or the image streamer; a "
						    "page server with an older criu-patches/0004: CRIU's log says which)");
			if (rc != 0)
				return make_error(rc < 0 ? -rc : EIO,
						  "pid %d: CRIU refused to leave the GPU state at %#" PRIx64 "-%#" PRIx64
						  " to the plugin (%s)",
						  t.pid, r.start, r.end, std::strerror(rc < 0 ? -rc : EIO));
			first = false;
		}
	write_dir_fd_ = dir_fd;
	return true;
}

Status DumpSession::write_gpu_image()
{
	int dir_fd = write_dir_fd_;
	uint64_t bytes = 0;
	std::vector<GpuSaveTarget> targets = gpu_save_targets(&bytes);
	unsigned threads = gpu_io_threads(options_.io_threads, bytes);
	// A dump given a parent image (--prev-images-dir) references the parent's chunks it finds unchanged.
	auto parent = read_parent_gpu_image(dir_fd);
	if (!parent)
		LOG_WARN("%s: every GPU chunk is written", parent.error().message().c_str());
	const GpuParentImage *from = parent && *parent ? &**parent : nullptr;
	std::string id = new_gpu_image_id();
	auto index = save_gpu_state(host_, dir_fd, targets, id, threads, kGpuChunkBytes, from, options_.zstd_level);
	if (!index)
		return std::move(index).error().context("%s", "cannot store the GPU image (the dump fails; every process "
							      "is returned to its state)");
	gpu_image_dir_fd_ = dir_fd;
	gpu_files_ = index->files;
	if (auto st = write_gpu_index(dir_fd, *index); !st) {
		remove_gpu_image(dir_fd, gpu_files_);
		return std::move(st).error().context("%s", "cannot store the GPU image");
	}
	gpu_image_id_ = id;
	uint64_t written = 0, in_parent = index->parent_bytes();
	size_t own_files = 0;
	for (const GpuDataFile &f : index->files) {
		written += f.parent_depth ? 0 : f.data_bytes;
		own_files += f.parent_depth ? 0 : 1;
	}
	// Compressed chunks: what they hold against what they take (written counts what they take).
	uint64_t packed_raw = 0, packed_stored = 0;
	for (const GpuProcessChunks &p : index->processes)
		for (const GpuChunk &c : p.chunks)
			if (c.compressed() && !index->files[c.file].parent_depth) {
				packed_raw += c.len;
				packed_stored += c.stored_len;
			}
	uint64_t kept = written - packed_stored + packed_raw; // the non-zero GPU state this dump stored
	double secs = static_cast<double>(std::max<uint64_t>(index->write_us, 1)) / 1e6;
	uint64_t zero = bytes > kept + in_parent ? bytes - kept - in_parent : 0;
	gpu_image_note_ = format("GPU image: %s of GPU state, %s written (%.1f%% zero pages) into %zu file(s) in %s, "
				 "%.2f GB/s",
				 human_bytes(bytes).c_str(), human_bytes(written).c_str(),
				 bytes ? 100.0 * static_cast<double>(zero) / static_cast<double>(bytes) : 0.0, own_files,
				 seconds(index->write_us).c_str(), static_cast<double>(bytes) / 1e9 / secs);
	if (options_.zstd_level > 0)
		gpu_image_note_ += format("; compressed (zstd-%d): %s of data stored in %s, %.2fx, %s raw; %.2f GB/s of "
					  "data",
					  options_.zstd_level, human_bytes(kept).c_str(), human_bytes(written).c_str(),
					  written ? static_cast<double>(kept) / static_cast<double>(written) : 1.0,
					  human_bytes(kept - packed_raw).c_str(), static_cast<double>(kept) / 1e9 / secs);
	if (from)
		gpu_image_note_ += format("; %s unchanged since the parent image, referenced in %zu of its file(s)",
					  human_bytes(in_parent).c_str(), index->files.size() - own_files);
	LOG_INFO("%s", gpu_image_note_.c_str());
	return {};
}

Status DumpSession::finish(bool dump_failed, bool leave_running)
{
	if (dump_failed && gpu_image_dir_fd_ >= 0) {
		// CRIU wrote no inventory: the image never restores; its GPU state can take as much disk as the GPUs.
		remove_gpu_image(gpu_image_dir_fd_, gpu_files_);
		LOG_INFO("dump failed: the GPU image's files (%zu) removed", gpu_files_.size() + 1);
	}
	if (!dump_failed && !leave_running)
		return {}; // CRIU kills the tasks now; their GPU state is in the image
	std::vector<ProcJob> jobs;
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
		pid_t pid = p.pid;
		jobs.push_back({pid, p.restore_tid, format("return pid %d to %s", pid, to_string(p.initial)),
				[pid, restore, unlock](Driver &d) -> Status {
					if (restore)
						if (auto st = d.restore(pid, {}); !st)
							return std::move(st).error();
					if (unlock)
						if (auto st = d.unlock(pid); !st)
							return std::move(st).error();
					return {};
				}});
	}
	if (targets.empty())
		return {};
	LOG_INFO("%s: returning %zu CUDA process(es) to the state they were found in",
		 dump_failed ? "dump failed" : "leave-running", targets.size());
	uint64_t t0 = now_us();
	std::vector<ProcResult> results =
		run_proc_jobs(host_, driver_, std::move(jobs), options_.parallel, options_.restore_timeout_ms);
	rollback_us_ = now_us() - t0;
	std::string failed;
	for (size_t i = 0; i < targets.size(); i++) {
		Proc &p = *targets[i];
		if (results[i].status) {
			p.checkpointed_by_us = p.locked_by_us = false;
			guard_.returned(p.pid);
			continue;
		}
		LOG_ERROR("could not return pid %d to its CUDA state '%s' (it is now '%s'): %s; if it still runs, "
			  "resume it with: cuda-criu resume %d",
			  p.pid, to_string(p.initial),
			  results[i].state_after_failure ? to_string(*results[i].state_after_failure) : "unknown",
			  results[i].status.error().message().c_str(),
			  p.pid);
		failed += (failed.empty() ? "" : ", ") + std::to_string(p.pid);
	}
	if (!failed.empty())
		return make_error(EIO, "CUDA processes not returned to their state: %s", failed.c_str());
	LOG_INFO("all CUDA processes are back as they were found (%s)", seconds(rollback_us_).c_str());
	return {};
}

// The machine's GPUs, from the driver's list (ordinals, memory), then those only the kernel driver lists
// (hidden from CRIU by CUDA_VISIBLE_DEVICES). used: those some process held; else the others the
// processes' driver knew of: all, unless every process has GPU nodes in its /dev (a container given
// some GPUs), then those whose nodes are there. The driver wants just these paired on a restore that
// moves a GPU.
std::vector<GpuRecord> DumpSession::machine_gpu_records(bool used) const
{
	std::set<GpuUuid> held, listed, reachable;
	bool all_reachable = false;
	for (const Proc &p : procs_) {
		held.insert(p.gpu_uuids.begin(), p.gpu_uuids.end());
		reachable.insert(p.reachable_gpus.begin(), p.reachable_gpus.end());
		all_reachable |= p.reachable_gpus.empty();
	}
	auto wanted = [&](const GpuUuid &u) {
		return used ? held.count(u) > 0 : !held.count(u) && (all_reachable || reachable.count(u));
	};
	std::vector<GpuRecord> out;
	for (const GpuInfo &g : machine_gpus_) {
		listed.insert(g.uuid);
		if (wanted(g.uuid))
			out.push_back({g.uuid, g.name, g.memory_bytes, g.pci_bus_id, g.ordinal});
	}
	for (const GpuInfo &g : kernel_gpus_)
		if (!listed.count(g.uuid) && wanted(g.uuid))
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
				       p.checkpoint_us, p.checkpoint_ranges, p.file_pages});
	r.device_phase_us = device_phase_us_;
	r.created_unix = static_cast<uint64_t>(std::time(nullptr));
	char host[256] = {};
	gethostname(host, sizeof(host) - 1);
	r.hostname = host;
	r.gpu_image_id = gpu_image_id_;
	r.gpu_checksums_id = gpu_checksums_id_;
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
		      pause_cost_.per_process().c_str(), checkpoint_cost_.per_process().c_str()) +
	       (gpu_image_note_.empty() ? "" : "; " + gpu_image_note_);
}

} // namespace cuda_criu
