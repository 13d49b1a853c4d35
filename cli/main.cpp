// cuda-criu: the command-line companion of cuda_plugin.so. It shares the plugin's core library.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/options.h"
#include "driver/libcuda.h"
#include "image/image.h"
#include "os/unique_fd.h"

using namespace cuda_criu;

namespace {

const char kUsage[] = R"(usage: cuda-criu COMMAND [ARGS]

Inspect and drive the CUDA checkpoint state of processes, and read the CUDA plugin's images.

Commands:
  status PID...            print each process's CUDA state: running, locked, checkpointed or failed
  lock PID... [--timeout SECONDS]
                           block new CUDA work and wait for work in flight (default timeout 10 s)
  checkpoint PID...        move a locked process's GPU state into its host memory
  restore PID...           move it back onto the GPU (the process stays locked)
  unlock PID...            let CUDA work proceed again
  resume PID...            bring a process back to running from whatever state it is in
                           (restore if checkpointed, then unlock): the way out for a process left
                           locked or checkpointed by an interrupted dump
  inspect DIR              show what the CUDA plugin recorded in the image directory DIR

The driver library is libcuda.so.1 from the loader's search path, or CUDA_CRIU_LIBCUDA.
Exit status: 0 on success, 1 when any operation failed, 2 on bad usage.
)";

int usage_error(const char *fmt, const char *arg)
{
	std::fprintf(stderr, "cuda-criu: ");
	std::fprintf(stderr, fmt, arg);
	std::fprintf(stderr, "\nTry 'cuda-criu --help'.\n");
	return 2;
}

Result<Driver *> driver()
{
	auto options = load_options_from_environment();
	if (!options)
		return std::move(options).error();
	return load_libcuda(options->libcuda);
}

int inspect(const char *dir)
{
	UniqueFd fd(open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	if (!fd.valid()) {
		std::fprintf(stderr, "cuda-criu: cannot open image directory %s: %s\n", dir, std::strerror(errno));
		return 1;
	}
	auto img = read_image(fd.get());
	if (!img) {
		std::fprintf(stderr, "cuda-criu: %s: %s\n", dir, img.error().message().c_str());
		return 1;
	}
	if (!img->has_value()) {
		std::printf("%s has no %s: no CUDA process was dumped by this plugin (an image of CRIU's own CUDA "
			    "plugin, or of processes without CUDA)\n",
			    dir, kImageFileName);
		return 0;
	}
	const ImageRecord &r = **img;
	std::printf("image format %u, plugin %s, NVIDIA driver %s, host %s\n", r.version, r.plugin_version.c_str(),
		    r.driver_version.c_str(), r.hostname.c_str());
	std::printf("checkpoint phase: %.3f s (all processes)\n", r.device_phase_us / 1e6);
	for (const GpuRecord &g : r.gpus)
		std::printf("GPU %d: %s %s, %.1f GiB, %s\n", g.ordinal, g.uuid.c_str(), g.name.c_str(),
			    g.memory_bytes / double(1ULL << 30), g.pci_bus_id.c_str());
	std::printf("%-8s %-8s %-13s %12s %10s %12s  %s\n", "PID", "NS-PID", "FOUND", "GPU-STATE", "LOCK", "CHECKPOINT",
		    "GPUS");
	for (const ProcessRecord &p : r.processes) {
		std::string gpus;
		for (const auto &u : p.gpu_uuids)
			gpus += (gpus.empty() ? "" : ",") + u;
		std::printf("%-8d %-8d %-13s %9.1f MiB %7.1f ms %9.3f s  %s\n", p.pid, p.ns_pid, p.initial_state.c_str(),
			    p.state_bytes / double(1 << 20), p.lock_us / 1e3, p.checkpoint_us / 1e6, gpus.c_str());
	}
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
		std::fputs(kUsage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	std::string cmd = argv[1];
	if (cmd == "inspect") {
		if (argc != 3)
			return usage_error("%s takes one image directory", "inspect");
		return inspect(argv[2]);
	}

	std::vector<pid_t> pids;
	unsigned timeout_ms = 10000;
	for (int i = 2; i < argc; i++) {
		if (!std::strcmp(argv[i], "--timeout") && i + 1 < argc) {
			double s = std::atof(argv[++i]);
			timeout_ms = static_cast<unsigned>(s * 1000);
			continue;
		}
		char *end = nullptr;
		long pid = std::strtol(argv[i], &end, 10);
		if (*end || pid <= 0)
			return usage_error("'%s' is not a pid", argv[i]);
		pids.push_back(static_cast<pid_t>(pid));
	}
	if (pids.empty())
		return usage_error("%s needs at least one pid", cmd.c_str());
	static const char *const known[] = {"status", "lock", "checkpoint", "restore", "unlock", "resume"};
	bool ok_cmd = false;
	for (const char *k : known)
		ok_cmd |= cmd == k;
	if (!ok_cmd)
		return usage_error("unknown command '%s'", cmd.c_str());

	auto d = driver();
	if (!d) {
		std::fprintf(stderr, "cuda-criu: %s\n", d.error().message().c_str());
		return 1;
	}
	int rc = 0;
	for (pid_t pid : pids) {
		Status st;
		if (cmd == "status") {
			auto s = (*d)->state(pid);
			if (s)
				std::printf("%d %s\n", pid, to_string(*s));
			else
				st = std::move(s).error();
		} else if (cmd == "lock") {
			st = (*d)->lock(pid, timeout_ms);
		} else if (cmd == "checkpoint") {
			st = (*d)->checkpoint(pid);
		} else if (cmd == "restore") {
			st = (*d)->restore(pid, {});
		} else if (cmd == "unlock") {
			st = (*d)->unlock(pid);
		} else if (cmd == "resume") {
			auto s = (*d)->state(pid);
			if (!s)
				st = std::move(s).error();
			else if (*s == CudaState::Checkpointed && !(st = (*d)->restore(pid, {})))
				;
			else if (*s != CudaState::Running)
				st = (*d)->unlock(pid);
			if (st)
				std::printf("%d running\n", pid);
		}
		if (!st) {
			std::fprintf(stderr, "cuda-criu: %s pid %d: %s\n", cmd.c_str(), pid, st.error().message().c_str());
			rc = 1;
		}
	}
	return rc;
}
