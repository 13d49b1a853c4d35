// The workload `cuda-criu selftest` checkpoints: this program, run as
//   cuda-criu __selftest-workload --mb N --state FILE [--libcuda PATH] [--interval-ms MS]
// It uses only the CUDA driver API, through dlopen, so that it needs no CUDA toolkit to build or run.
// It fills N MiB of device memory with a pattern known from (chunk, generation), then forever: reads
// every chunk back and compares it, rewrites one chunk with a new generation, and replaces FILE with
//   iterations=N / status=ok / pid=P / mb=N / device=NAME        (one per line)
// A mismatch or a driver error writes "status=FAIL <what>" and exits with status 2.
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "driver/cuda_api.h"
#include "driver/libcuda.h"

namespace cuda_criu::cli {
namespace {

constexpr size_t kChunk = 16ULL << 20;

class Workload {
public:
	Workload(std::string state_file, size_t mb) : state_file_(std::move(state_file)), mb_(mb) {}

	[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 2, 3)))
	{
		va_list ap;
		va_start(ap, fmt);
		std::string what = vformat(fmt, ap);
		va_end(ap);
		std::fprintf(stderr, "selftest workload %d: FAIL %s\n", static_cast<int>(getpid()), what.c_str());
		write_state("FAIL " + what);
		std::exit(2);
	}

	void load(const std::string &libcuda)
	{
		auto lib = open_libcuda(libcuda);
		if (!lib)
			fail("%s", lib.error().message().c_str());
		std::string missing = resolve_cuda_api(lib->handle, api_, EntryKind::Basic);
		std::string workload = resolve_cuda_api(lib->handle, api_, EntryKind::Workload);
		if (!api_.device_get || !api_.device_get_name)
			missing += (missing.empty() ? "" : ", ") + std::string("cuDeviceGet, cuDeviceGetName");
		if (!workload.empty())
			missing += (missing.empty() ? "" : ", ") + workload;
		if (!missing.empty())
			fail("%s lacks %s", lib->file.c_str(), missing.c_str());
	}

	[[noreturn]] void run(unsigned interval_ms)
	{
		CUdevice dev = 0;
		CUcontext ctx = nullptr;
		check(api_.init(0), "cuInit");
		check(api_.device_get(&dev, 0), "cuDeviceGet");
		char name[256] = {};
		check(api_.device_get_name(name, sizeof(name) - 1, dev), "cuDeviceGetName");
		device_ = name;
		check(api_.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
		check(api_.ctx_set_current(ctx), "cuCtxSetCurrent");
		const size_t total = mb_ << 20;
		check(api_.mem_alloc(&dptr_, total), "cuMemAlloc");

		const size_t chunks = (total + kChunk - 1) / kChunk;
		generation_.assign(chunks, 0);
		host_.resize(std::min(total, kChunk) / 8);
		for (size_t c = 0; c < chunks; c++) {
			fill(c);
			check(api_.memcpy_htod(dptr_ + c * kChunk, host_.data(), chunk_bytes(c)), "cuMemcpyHtoD");
		}
		write_state("ok");

		for (;;) {
			pause_ms(interval_ms);
			for (size_t c = 0; c < chunks; c++)
				verify(c);
			iterations_++;
			size_t c = (iterations_ - 1) % chunks;
			generation_[c] = iterations_;
			fill(c);
			check(api_.memcpy_htod(dptr_ + c * kChunk, host_.data(), chunk_bytes(c)), "cuMemcpyHtoD");
			write_state("ok");
		}
	}

private:
	void check(CUresult r, const char *call)
	{
		if (r == CUDA_SUCCESS)
			return;
		const char *name = nullptr;
		if (api_.get_error_name(r, &name) != CUDA_SUCCESS || !name)
			name = "unknown error";
		fail("%s failed: %s (%d)", call, name, static_cast<int>(r));
	}

	static uint64_t mix(uint64_t z)
	{
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
		return z ^ (z >> 31);
	}

	uint64_t word(size_t chunk, size_t index) const
	{
		uint64_t base = mix(0x5e1f7e57ULL ^ mix((static_cast<uint64_t>(chunk) << 32) ^ generation_[chunk]));
		return mix(base + index * 0x9e3779b97f4a7c15ULL);
	}

	size_t chunk_bytes(size_t chunk) const { return std::min(kChunk, (mb_ << 20) - chunk * kChunk); }

	void fill(size_t chunk)
	{
		for (size_t w = 0; w < chunk_bytes(chunk) / 8; w++)
			host_[w] = word(chunk, w);
	}

	void verify(size_t chunk)
	{
		check(api_.memcpy_dtoh(host_.data(), dptr_ + chunk * kChunk, chunk_bytes(chunk)), "cuMemcpyDtoH");
		for (size_t w = 0; w < chunk_bytes(chunk) / 8; w++)
			if (host_[w] != word(chunk, w))
				fail("data mismatch in chunk %zu at byte %zu (generation %llu, iteration %llu): expected "
				     "0x%016llx, found 0x%016llx",
				     chunk, w * 8, static_cast<unsigned long long>(generation_[chunk]),
				     static_cast<unsigned long long>(iterations_) + 1,
				     static_cast<unsigned long long>(word(chunk, w)), static_cast<unsigned long long>(host_[w]));
	}

	// Replaced by rename, so that a reader never sees half a file.
	void write_state(const std::string &status)
	{
		std::string tmp = state_file_ + ".tmp";
		FILE *f = std::fopen(tmp.c_str(), "we");
		if (!f)
			return;
		std::fprintf(f, "iterations=%llu\nstatus=%s\npid=%d\nmb=%zu\ndevice=%s\n",
			     static_cast<unsigned long long>(iterations_), status.c_str(), static_cast<int>(getpid()), mb_,
			     device_.c_str());
		if (std::fclose(f) == 0)
			std::rename(tmp.c_str(), state_file_.c_str());
	}

	static void pause_ms(unsigned ms)
	{
		timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}

	CudaApi api_;
	std::string state_file_;
	size_t mb_;
	std::string device_;
	CUdeviceptr dptr_ = 0;
	std::vector<uint64_t> generation_;
	std::vector<uint64_t> host_;
	uint64_t iterations_ = 0;
};

} // namespace

int cmd_selftest_workload(const Invocation &in)
{
	const ParsedArgs &a = in.args;
	if (!a.value("--mb") || !a.value("--state"))
		return usage_error(kSelftestWorkloadCommand, "usage: --mb N --state FILE [--libcuda PATH] [--interval-ms MS]");
	std::string interval_text = "50", libcuda;
	a.get("--interval-ms", interval_text);
	a.get("--libcuda", libcuda);
	auto mb = parse_count(*a.value("--mb"), 1, 1 << 20);
	auto interval = parse_count(interval_text, 0, 60000);
	if (!mb || !interval)
		return usage_error(kSelftestWorkloadCommand, "bad --mb or --interval-ms");
	Workload w(*a.value("--state"), *mb);
	w.load(libcuda);
	w.run(static_cast<unsigned>(*interval));
}

} // namespace cuda_criu::cli
