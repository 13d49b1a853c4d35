#include "fakes.h"

#include <chrono>
#include <thread>

namespace cuda_criu::testing {

// Counts a call in flight for its whole length, after sleeping the op's delay if one is set.
class FakeDriver::Call {
public:
	Call(FakeDriver &d, const char *op) : d_(d)
	{
		unsigned ms = 0;
		{
			std::lock_guard<std::mutex> g(d_.mu);
			d_.in_flight_++;
			if (auto it = d_.delay_ms.find(op); it != d_.delay_ms.end())
				ms = it->second;
		}
		std::this_thread::sleep_for(std::chrono::milliseconds(ms));
	}
	~Call()
	{
		std::lock_guard<std::mutex> g(d_.mu);
		d_.in_flight_--;
		d_.idle_.notify_all();
	}

private:
	FakeDriver &d_;
};

void FakeDriver::wait_idle()
{
	std::unique_lock<std::mutex> g(mu);
	idle_.wait(g, [this] { return in_flight_ == 0; });
}

Status FakeDriver::step(const char *op, pid_t pid, CudaState from, CudaState to, bool needs_thread)
{
	Call call(*this, op);
	std::lock_guard<std::mutex> g(mu);
	calls.push_back(std::string(op) + " " + std::to_string(pid));
	auto f = fail.find(op);
	if (f != fail.end() && (f->second.count(pid) || f->second.count(0)))
		return make_error(EIO, "%s failed: CUDA_ERROR_UNKNOWN (999): injected", op);
	auto it = procs.find(pid);
	if (it == procs.end())
		return make_error(kNoCudaState, "%s failed: CUDA_ERROR_NOT_INITIALIZED (3)", op);
	if (it->second.state != from)
		return make_error(kWrongState, "%s failed: CUDA_ERROR_ILLEGAL_STATE (401): process is %s", op,
				  to_string(it->second.state));
	if (needs_thread && running_threads && !running_threads->count(it->second.tid))
		return make_error(EIO, "%s failed: restore thread %d is not running", op, it->second.tid);
	it->second.state = to;
	return {};
}

Result<pid_t> FakeDriver::restore_thread_id(pid_t pid)
{
	Call call(*this, "getrestoretid");
	std::lock_guard<std::mutex> g(mu);
	if (fail.count("getrestoretid") && (fail["getrestoretid"].count(pid) || fail["getrestoretid"].count(0)))
		return make_error(EIO, "injected");
	auto it = procs.find(pid);
	if (it == procs.end())
		return make_error(kNoCudaState, "cuCheckpointProcessGetRestoreThreadId failed: CUDA_ERROR_NOT_INITIALIZED (3)");
	return it->second.tid;
}

Result<CudaState> FakeDriver::state(pid_t pid)
{
	Call call(*this, "state");
	std::lock_guard<std::mutex> g(mu);
	auto it = procs.find(pid);
	if (it == procs.end())
		return make_error(EIO, "not found");
	return it->second.state;
}

Status FakeDriver::lock(pid_t pid, unsigned) { return step("lock", pid, CudaState::Running, CudaState::Locked, false); }
Status FakeDriver::checkpoint(pid_t pid)
{
	return step("checkpoint", pid, CudaState::Locked, CudaState::Checkpointed, true);
}
Status FakeDriver::restore(pid_t pid, const std::vector<GpuPair> &pairs)
{
	{
		std::lock_guard<std::mutex> g(mu);
		last_pairs = pairs;
	}
	return step("restore", pid, CudaState::Checkpointed, CudaState::Locked, true);
}
Status FakeDriver::unlock(pid_t pid) { return step("unlock", pid, CudaState::Locked, CudaState::Running, false); }

Result<std::vector<GpuInfo>> FakeDriver::gpus()
{
	GpuInfo g;
	g.name = "Fake GPU";
	g.memory_bytes = 1ULL << 34;
	g.uuid.bytes[0] = 0xab;
	return std::vector<GpuInfo>{g};
}

TaskInfo FakeHost::task_info(pid_t pid)
{
	TaskInfo t;
	auto it = ns_pids.find(pid);
	t.ns_pid = it != ns_pids.end() ? it->second : pid;
	t.rss_bytes = 1 << 20;
	auto a = anon.find(pid);
	t.anon_bytes = a != anon.end() ? a->second : 1 << 20;
	if (auto m = minors.find(pid); m != minors.end())
		t.nvidia_minors = m->second;
	t.stopped = stopped_pids.count(pid) > 0;
	return t;
}

namespace {
class FakeRun final : public RunningThread {
public:
	FakeRun(std::set<pid_t> &running, pid_t tid, bool fail_stop)
		: running_(running), tid_(tid), fail_stop_(fail_stop)
	{
		running_.insert(tid);
	}
	~FakeRun() override { running_.erase(tid_); }
	Status stop() override
	{
		running_.erase(tid_);
		if (fail_stop_)
			return make_error(ESRCH, "restore thread %d exited while it ran (signal 9)", tid_);
		return {};
	}

private:
	std::set<pid_t> &running_;
	pid_t tid_;
	bool fail_stop_;
};
} // namespace

Result<std::unique_ptr<RunningThread>> FakeHost::let_run(pid_t tid, std::optional<BufferPolicy> buffer)
{
	let_runs++;
	buffer_policies[tid] = buffer;
	if (fail_let_run.count(tid))
		return make_error(ESRCH, "restore thread %d: read /proc/%d/status: No such file or directory", tid, tid);
	return std::unique_ptr<RunningThread>(new FakeRun(running_threads, tid, fail_stop.count(tid) > 0));
}

Status FakeHost::read_memory(pid_t pid, uint64_t addr, void *buf, size_t len)
{
	std::lock_guard<std::mutex> g(memory_mu);
	if (memory_fails.count(pid))
		return make_error(ESRCH, "read at %#llx of pid %d: no such process", static_cast<unsigned long long>(addr), pid);
	auto *p = static_cast<uint8_t *>(buf);
	const auto &m = memory[pid];
	for (size_t i = 0; i < len; i++) {
		auto it = m.find(addr + i);
		p[i] = it == m.end() ? 0 : it->second;
	}
	return {};
}

Status FakeHost::write_memory(pid_t pid, uint64_t addr, const void *buf, size_t len)
{
	std::lock_guard<std::mutex> g(memory_mu);
	if (memory_fails.count(pid))
		return make_error(ESRCH, "write at %#llx of pid %d: no such process", static_cast<unsigned long long>(addr), pid);
	const auto *p = static_cast<const uint8_t *>(buf);
	auto &m = memory[pid];
	for (size_t i = 0; i < len; i++)
		if (p[i])
			m[addr + i] = p[i];
		else
			m.erase(addr + i);
	return {};
}

uint64_t FakeHost::thread_cpu_ticks(pid_t pid, pid_t tid)
{
	(void)pid;
	std::lock_guard<std::mutex> g(ticks_mu);
	auto it = cpu_ticks.find(tid);
	return it != cpu_ticks.end() ? it->second : 0;
}

Result<FreeSpace> FakeHost::free_space_at(int dir_fd)
{
	space_asked.push_back(dir_fd);
	if (space_error)
		return *space_error;
	return space;
}

std::vector<pid_t> FakeHost::processes_mapping(const std::string &dev, uint64_t inode)
{
	std::vector<pid_t> out;
	for (const auto &[pid, files] : ipc_files)
		for (const IpcFileMapping &f : files)
			if (f.dev == dev && f.inode == inode && !dead.count(pid)) {
				out.push_back(pid);
				break;
			}
	return out;
}

namespace {

class FakeReservations final : public GpuReservations {
public:
	explicit FakeReservations(std::shared_ptr<FakeHost::Ledger> ledger) : ledger_(std::move(ledger)) {}
	void settle(pid_t process) override
	{
		std::lock_guard<std::mutex> g(ledger_->mu);
		ledger_->settled.push_back(process);
		std::erase_if(ledger_->entries, [&](const GpuReservation &r) { return r.owner == 0 && r.process == process; });
	}
	void release() override
	{
		std::lock_guard<std::mutex> g(ledger_->mu);
		std::erase_if(ledger_->entries, [](const GpuReservation &r) { return r.owner == 0; });
	}

private:
	std::shared_ptr<FakeHost::Ledger> ledger_;
};

} // namespace

Result<std::shared_ptr<GpuReservations>> FakeHost::reserve_gpu_memory(const GpuLedgerPlace &place,
								      const ReserveDecision &decide)
{
	if (ledger->on_lock)
		ledger->on_lock();
	std::vector<GpuReservation> others;
	{
		std::lock_guard<std::mutex> g(ledger->mu);
		ledger->place = place;
		std::erase_if(ledger->entries, [](const GpuReservation &r) { return r.owner == 0; });
		if (ledger->usable)
			others = ledger->entries;
	}
	auto mine = decide(others);
	if (!mine)
		return std::move(mine).error();
	if (!ledger->usable)
		return std::shared_ptr<GpuReservations>();
	std::lock_guard<std::mutex> g(ledger->mu);
	for (GpuReservation r : *mine) {
		r.owner = 0;
		ledger->entries.push_back(r);
	}
	ledger->reserved.push_back(std::move(*mine));
	return std::shared_ptr<GpuReservations>(std::make_shared<FakeReservations>(ledger));
}

std::vector<Mapping> FakeHost::memory_map(pid_t pid)
{
	std::lock_guard<std::mutex> g(maps_mu);
	auto it = maps.find(pid);
	if (it == maps.end() || it->second.empty())
		return {};
	std::vector<Mapping> m = it->second.front();
	if (it->second.size() > 1)
		it->second.erase(it->second.begin());
	return m;
}

} // namespace cuda_criu::testing
