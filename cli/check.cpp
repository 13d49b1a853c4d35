// cuda-criu check: can this machine checkpoint and restore CUDA processes? One line per check.
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cli.h"
#include "commands.h"
#include "core/dump_refusals.h"
#include "core/options.h"
#include "criu_info.h"
#include "base/text.h"
#include "driver/cuda_api.h"
#include "driver/libcuda.h"
#include "driver/nvml.h"
#include "elf_file.h"
#include "json.h"
#include "os/checkpoint_buffer.h"
#include "os/host.h"
#include "os/proc.h"
#include "os/thp.h"
#include "criu_check.h"
#include "runtimes.h"

namespace cuda_criu::cli {
namespace {

// What the checks found, beyond their lines, for --json.
struct Facts {
	bool driver_loaded = false;
	std::string library;
	std::string kernel_module_version;
	std::string cuda_version;
	bool checkpoint_api = false;
	std::vector<GpuInfo> gpus;
	CriuFacts criu;
	std::vector<RuntimeReport> runtimes;
	std::optional<ThpSettings> thp;
};

std::string read_first_line(const std::string &path)
{
	std::ifstream f(path);
	std::string line;
	std::getline(f, line);
	return line;
}

bool exists(const std::string &path)
{
	struct stat st;
	return stat(path.c_str(), &st) == 0;
}

// ---- driver and GPUs ----

constexpr const char *kNoGpuHint =
	"this machine shows no NVIDIA GPU (no /proc/driver/nvidia/gpus entry): nothing to checkpoint here "
	"(--require-gpu makes this a failure)";

// The GPUs the driver sees, each with its free memory. missing: the level when there are none;
// none_hint: the hint then.
void check_gpus(Checks &c, Facts &facts, const std::string &libcuda, Level missing, const char *none_hint)
{
	auto d = load_libcuda(libcuda);
	if (!d) {
		c.add("gpus", missing, d.error().message(), "is the NVIDIA kernel module loaded and /dev/nvidia* present?");
		return;
	}
	auto gpus = (*d)->gpus();
	if (!gpus) {
		c.add("gpus", missing, gpus.error().message());
		return;
	}
	if (gpus->empty()) {
		c.add("gpus", missing, "the driver sees no GPU", none_hint);
		return;
	}
	for (GpuInfo &g : *gpus) {
		g.free_bytes = (*d)->free_bytes(g.uuid);
		std::string free = g.free_bytes ? " (" + human_bytes(g.free_bytes) + " free)" : "";
		c.add(format("gpu%d", g.ordinal), Level::Ok,
		      format("%s %s, %s%s, %s", g.uuid.str().c_str(), g.name.c_str(), human_bytes(g.memory_bytes).c_str(),
			     free.c_str(), g.pci_bus_id.c_str()));
	}
	facts.gpus = std::move(*gpus);
}

void check_driver(Checks &c, Facts &facts, bool require_gpu, const std::string &libcuda)
{
	const bool gpu_expected = require_gpu || nvidia_driver_present(libcuda);
	const Level missing = gpu_expected ? Level::Fail : Level::Warn;
	// Opened (not initialised) first: the library may lack the checkpoint API, which is reported below.
	auto lib = open_libcuda(libcuda);
	if (!lib) {
		c.add("driver", missing, lib.error().message(),
		      gpu_expected ? "install the NVIDIA driver (r570 or newer), or set CUDA_CRIU_LIBCUDA to the path of "
				     "libcuda.so.1"
				   : kNoGpuHint);
		return;
	}
	facts.driver_loaded = true;
	facts.library = lib->file;
	facts.cuda_version = lib->cuda_version;
	facts.kernel_module_version = kernel_driver_version();

	std::string detail = facts.library;
	detail += facts.kernel_module_version.empty() ? ", kernel module version unknown"
						      : ", kernel module " + facts.kernel_module_version;
	if (!facts.cuda_version.empty())
		detail += ", CUDA " + facts.cuda_version;
	// The library file carries its version (libcuda.so.580.95.05); it must match the loaded module.
	std::string base = facts.library.substr(facts.library.rfind('/') + 1);
	std::string lib_version = base.rfind("libcuda.so.", 0) == 0 ? base.substr(11) : "";
	if (lib_version.find('.') != std::string::npos && !facts.kernel_module_version.empty() &&
	    lib_version != facts.kernel_module_version)
		c.add("driver", Level::Fail, detail + ": library and kernel module versions differ",
		      "the driver was upgraded without reloading the kernel module: reboot, or unload and reload the "
		      "nvidia modules");
	else
		c.add("driver", Level::Ok, detail);

	CudaApi api;
	std::string absent = resolve_cuda_api(lib->handle, api, EntryKind::Checkpoint);
	if (!absent.empty()) {
		c.add("checkpoint-api", missing, "the driver lacks " + absent,
		      "CUDA checkpoint/restore needs NVIDIA driver r570 or newer: upgrade the driver");
		return;
	}
	facts.checkpoint_api = true;
	c.add("checkpoint-api", Level::Ok, entry_point_names(EntryKind::Checkpoint));

	check_gpus(c, facts, libcuda, missing,
		   gpu_expected ? "check CUDA_VISIBLE_DEVICES and that the GPUs are not excluded or in a fault state"
				: kNoGpuHint);
}

// NVML tells a restore how much memory is free on each GPU; without it only the total is checked.
void check_nvml(Checks &c)
{
	if (!nvidia_kernel_driver_loaded())
		return; // no NVIDIA kernel driver
	if (load_nvml())
		c.add("nvml", Level::Ok, "libnvidia-ml.so.1: a restore checks the free memory of the GPUs it uses");
	else
		c.add("nvml", Level::Warn, "libnvidia-ml.so.1 cannot be loaded or initialised",
		      "install the NVIDIA driver's NVML library: without it a restore checks only the GPUs' total "
		      "memory, and a GPU without room fails in the driver instead");
}

// Persistence mode: from NVML for each GPU when it loads; otherwise whether the daemon that keeps GPUs
// initialized runs (a mode set with `nvidia-smi -pm 1` cannot be seen without NVML).
void check_persistence(Checks &c, const std::vector<GpuInfo> &gpus)
{
	if (!nvidia_kernel_driver_loaded())
		return; // no NVIDIA kernel driver: nothing to persist
	const char *hint = "enable it (nvidia-smi -pm 1, or systemctl enable --now nvidia-persistenced): without "
			   "persistence, a GPU whose processes are all checkpointed is shut down, and set up again at "
			   "restore, which costs seconds";
	std::string off;
	size_t known = 0;
	for (const GpuInfo &g : gpus)
		if (auto on = nvml_persistence_mode(g.uuid)) {
			known++;
			if (!*on)
				off += format("%sGPU %d", off.empty() ? "" : ", ", g.ordinal);
		}
	if (known && known == gpus.size()) {
		if (off.empty())
			c.add("persistence", Level::Ok, "persistence mode is on for every GPU (NVML)");
		else
			c.add("persistence", Level::Warn, "persistence mode is off for " + off + " (NVML)", hint);
		return;
	}
	pid_t pid = 0;
	for (const char *f : {"/run/nvidia-persistenced/nvidia-persistenced.pid",
			      "/var/run/nvidia-persistenced/nvidia-persistenced.pid"}) {
		std::ifstream in(f);
		if (in >> pid && pid > 0 && read_first_line(format("/proc/%d/comm", pid)).rfind("nvidia-persist", 0) == 0)
			break;
		pid = 0;
	}
	if (pid)
		c.add("persistence", Level::Ok, format("nvidia-persistenced runs (pid %d): GPUs stay initialized", pid));
	else
		c.add("persistence", Level::Warn, "nvidia-persistenced is not running (and NVML cannot tell the mode)",
		      hint);
}

// ---- CRIU and the plugin ----

// criu: --criu, libdir: --libdir ("" when not given).
void check_criu_and_plugin(Checks &c, Facts &facts, const std::string &criu, const std::string &libdir)
{
	facts.criu = check_criu(c, find_criu(criu));
	if (libdir.empty()) {
		// Where nothing sets libdir, the plugin that came with cuda-criu is the one its commands give
		// criu.
		Libdir where = criu_libdir(caller_criu_env(), "");
		if (std::string own = find_companion(Companion::PluginDir); where.crius_default && !own.empty())
			where = {own, "beside cuda-criu, for criu -L: selftest, roundtrip and migrate give it; "
				      "no libdir set"};
		c.add(check_plugin(where, "set libdir in " + criu_config_dir() + "/default.conf to its directory"));
	} else
		c.add(check_plugin({libdir, "criu -L"}, "give its directory with --libdir"));

	auto options = load_options_from_environment();
	if (!options)
		c.add("plugin-options", Level::Fail, options.error().message(),
		      "fix the file or the CUDA_CRIU_* variable named; every dump would fail with it");
	else
		c.add("plugin-options", Level::Ok,
		      format("%s: lock timeout %.1f s, checkpoint timeout %.0f s, restore timeout %.0f s",
			     options->config_file.empty() ? "defaults (no option file)" : options->config_file.c_str(),
			     options->lock_timeout_ms / 1000.0, options->checkpoint_timeout_ms / 1000.0,
			     options->restore_timeout_ms / 1000.0));
}

// A runtime that cannot make CRIU load our plugin only warns: this machine may not use it.
// all: false for --runtimes none; only: the runtimes of --runtimes (empty: every one found); criu: --criu;
// containerd: --containerd, the containerd reported instead of the installed one (a failure when it
// cannot be found: it was named).
void check_runtime_lines(Checks &c, Facts &facts, bool all, const std::vector<std::string> &only,
			 const std::string &criu, const std::string &containerd)
{
	if (all) {
		std::vector<std::string> names = only;
		if (!containerd.empty()) {
			if (names.empty())
				names = {"runc", "crun", "podman"};
			std::erase(names, "containerd");
		}
		if (!names.empty() || containerd.empty())
			facts.runtimes = check_runtimes(names, criu);
	}
	if (!containerd.empty()) {
		Result<RuntimeReport> r = check_containerd_at(containerd, criu);
		if (r)
			facts.runtimes.push_back(*r);
		else
			c.add("runtime-containerd", Level::Fail, r.error().message(),
			      "name containerd's configuration file (its --config) or the socket it serves (its grpc address)");
	}
	for (const RuntimeReport &r : facts.runtimes)
		c.add("runtime-" + r.name, r.loads ? Level::Ok : Level::Warn, r.detail, r.fix);
}

// ---- the host ----

void check_privileges(Checks &c)
{
	if (geteuid() == 0) {
		c.add("privileges", Level::Ok, "root");
		return;
	}
	uint64_t caps = 0;
	std::ifstream f("/proc/self/status");
	std::string line;
	while (std::getline(f, line))
		if (line.rfind("CapEff:", 0) == 0)
			caps = std::strtoull(line.c_str() + 7, nullptr, 16);
	constexpr int kCapSysPtrace = 19, kCapSysAdmin = 21, kCapCheckpointRestore = 40;
	auto has = [&](int cap) { return (caps >> cap) & 1; };
	if (has(kCapSysPtrace) && (has(kCapCheckpointRestore) || has(kCapSysAdmin)))
		c.add("privileges", Level::Ok,
		      format("uid %d with CAP_SYS_PTRACE and %s (criu needs --unprivileged)", static_cast<int>(geteuid()),
			     has(kCapCheckpointRestore) ? "CAP_CHECKPOINT_RESTORE" : "CAP_SYS_ADMIN"));
	else
		c.add("privileges", Level::Fail,
		      format("uid %d without CAP_SYS_PTRACE and CAP_CHECKPOINT_RESTORE", static_cast<int>(geteuid())),
		      "run as root (sudo cuda-criu check), or give CRIU CAP_CHECKPOINT_RESTORE and CAP_SYS_PTRACE");
}

void check_kernel(Checks &c)
{
	utsname u{};
	uname(&u);
	// ns_last_pid and kcmp() exist only in kernels built with CONFIG_CHECKPOINT_RESTORE.
	bool ns_last_pid = exists("/proc/sys/kernel/ns_last_pid");
	bool kcmp = !(syscall(SYS_kcmp, getpid(), getpid(), KCMP_VM, 0, 0) < 0 && errno == ENOSYS);
	bool map_files = exists("/proc/self/map_files");
	if (ns_last_pid && kcmp && map_files)
		c.add("kernel", Level::Ok,
		      format("Linux %s with checkpoint/restore support (ns_last_pid, kcmp, map_files)", u.release));
	else
		c.add("kernel", Level::Fail,
		      format("Linux %s lacks%s%s%s", u.release, ns_last_pid ? "" : " /proc/sys/kernel/ns_last_pid",
			     kcmp ? "" : " kcmp()", map_files ? "" : " /proc/self/map_files"),
		      "CRIU needs a kernel built with CONFIG_CHECKPOINT_RESTORE (all major distributions' kernels are)");

	std::string scope = read_first_line("/proc/sys/kernel/yama/ptrace_scope");
	if (scope.empty())
		c.add("ptrace", Level::Ok, "no Yama ptrace restrictions");
	else if (scope == "3")
		c.add("ptrace", Level::Fail, "kernel.yama.ptrace_scope is 3: no process may be traced, CRIU cannot attach",
		      "ptrace_scope 3 can only be lowered by a reboot; boot with kernel.yama.ptrace_scope=1 or 2");
	else
		c.add("ptrace", Level::Ok, format("kernel.yama.ptrace_scope %s: root may attach", scope.c_str()));
}

// Transparent huge pages: what the plugin gets for the driver's checkpoint buffer on this host. The
// plugin itself puts that buffer on huge pages (MADV_HUGEPAGE) and populates it with its own threads
// (os/checkpoint_buffer.h), so THP `madvise`, the Debian and Ubuntu default, is enough and the machine's
// setting is left as it is; only `never` (or huge-pages=off) leaves small pages.
void check_thp(Checks &c, Facts &facts)
{
	const char *measured = "on an H200 (driver 580) the driver's checkpoint of 4.5 GiB took 1.1-1.2 s this way "
			       "against 2.0-2.9 s as the driver does it alone";
	const unsigned threads = default_buffer_threads();
	auto options = load_options_from_environment();
	if (options && !options->huge_pages) {
		c.add("thp", Level::Warn,
		      "huge-pages off: the driver's checkpoint buffer is left to the driver (one thread, small pages "
		      "unless transparent huge pages are always)",
		      format("remove huge-pages=off (CUDA_CRIU_HUGE_PAGES) to let the plugin prepare it; %s", measured));
		return;
	}
	auto thp = read_thp_settings();
	if (!thp) {
		c.add("thp", Level::Warn,
		      format("%s: the plugin populates the driver's checkpoint buffer with %u threads, on small pages",
			     thp.error().message().c_str(), threads),
		      thp.error().errno_value() == ENOENT
			      ? "this kernel is built without transparent huge pages (CONFIG_TRANSPARENT_HUGEPAGE)"
			      : "the kernel's transparent huge page settings could not be read");
		return;
	}
	facts.thp = *thp;
	// Where the PMD size has a mode of its own (kernels from 6.8), that file decides and is the one to set.
	const bool own = !thp->pmd_size_mode.empty() && thp->pmd_size_mode != "inherit";
	std::string detail = "transparent huge pages " + thp->pmd_mode;
	std::string notes;
	if (own)
		notes = format("%s; enabled: %s", thp->pmd_size_file.c_str(), thp->enabled.c_str());
	if (!thp->defrag.empty())
		notes += (notes.empty() ? "defrag " : "; defrag ") + thp->defrag;
	if (!notes.empty())
		detail += " (" + notes + ")";
	if (thp->pmd_mode != "never") {
		c.add("thp", Level::Ok,
		      detail + format(": the plugin puts each dumped process's checkpoint buffer on huge pages and "
				      "populates it with %u threads",
				      threads));
		return;
	}
	const std::string file = own ? thp->pmd_size_file : std::string(kThpSysfsDir) + "/enabled";
	c.add("thp", Level::Warn,
	      detail + format(": the plugin populates the driver's checkpoint buffer with %u threads, on small "
			      "pages; a restore reads zero memory 4 KiB at a time",
			      threads),
	      format("madvise is enough (the Debian and Ubuntu default; only memory that asks gets huge pages): "
		     "echo madvise > %s; %s",
		     file.c_str(), measured));
}

void print_text(const Checks &c)
{
	int counts[3] = {0, 0, 0};
	for (const CheckLine &l : c.lines()) {
		counts[static_cast<int>(l.level)]++;
		std::printf("%-5s %-18s %s\n", level_name(l.level), l.name.c_str(), l.detail.c_str());
		if (l.level != Level::Ok && !l.hint.empty())
			std::printf("      hint: %s\n", l.hint.c_str());
	}
	std::printf("result: %s (%d ok, %d warn, %d fail)\n", level_name(c.worst()), counts[0], counts[1], counts[2]);
}

void print_json(const Checks &c, const Facts &f)
{
	Json j = {{"result", level_name(c.worst())}};
	Json checks = Json::array();
	for (const CheckLine &l : c.lines())
		checks.push_back(Json{{"name", l.name},
				      {"status", level_name(l.level)},
				      {"detail", l.detail},
				      {"hint", l.hint.empty() || l.level == Level::Ok ? Json() : Json(l.hint)}});
	j["checks"] = checks;
	if (f.driver_loaded)
		j["driver"] = Json{{"library", f.library},
				   {"kernel_module_version", f.kernel_module_version},
				   {"cuda_version", f.cuda_version},
				   {"checkpoint_api", f.checkpoint_api}};
	else
		j["driver"] = nullptr;
	Json gpus = Json::array();
	for (const GpuInfo &g : f.gpus)
		gpus.push_back(Json{{"ordinal", g.ordinal},
				    {"uuid", g.uuid.str()},
				    {"name", g.name},
				    {"memory_bytes", g.memory_bytes},
				    {"free_bytes", g.free_bytes},
				    {"pci_bus_id", g.pci_bus_id}});
	j["gpus"] = gpus;
	if (const CriuFacts &c = f.criu; c.location)
		j["criu"] = Json{{"path", c.location->path},
				 {"found_by", c.location->how},
				 {"version", c.version ? Json(c.version->text) : Json()},
				 {"device_hooks", c.version ? Json(has_device_hooks(*c.version)) : Json()},
				 {"patched", c.patched ? Json(*c.patched) : Json()}};
	else
		j["criu"] = nullptr;
	if (f.thp)
		j["thp"] = Json{{"enabled", f.thp->enabled},
				{"defrag", f.thp->defrag.empty() ? Json() : Json(f.thp->defrag)},
				{"pmd_size_enabled", f.thp->pmd_size_mode.empty() ? Json() : Json(f.thp->pmd_size_mode)},
				{"effective", f.thp->pmd_mode}};
	else
		j["thp"] = nullptr;
	Json runtimes = Json::array();
	for (const RuntimeReport &r : f.runtimes)
		runtimes.push_back(Json{{"name", r.name},
					{"binary", r.binary},
					{"version", r.version},
					{"loads_plugin", r.loads},
					{"plugin_dir", r.plugin_dir},
					{"libdir_source", r.libdir_source}});
	j["runtimes"] = runtimes;
	std::fputs(json_text(j).c_str(), stdout);
}

// pid-N: whether a dump of process N would get past what the plugin refuses before its lock (the same
// checks, core/dump_refusals.h): what the driver would checkpoint into an image that cannot restore.
void check_processes(Checks &c, const std::vector<pid_t> &pids)
{
	SystemHost host;
	for (pid_t pid : pids) {
		std::string name = "pid-" + std::to_string(pid);
		if (!process_exists(pid)) {
			c.add(name, Level::Fail, format("no process %d", pid));
			continue;
		}
		if (!maps_libcuda(pid)) {
			c.add(name, Level::Ok, format("pid %d does not use CUDA: CRIU dumps it as a plain process", pid));
			continue;
		}
		if (host.task_info(pid).stopped) {
			c.add(name, Level::Fail, format("pid %d is stopped: the driver cannot lock a stopped CUDA process", pid),
			      format("kill -CONT %d", pid));
			continue;
		}
		if (Status st = refuse_sharing(host, pid); !st) {
			c.add(name, Level::Fail, format("pid %d cannot be checkpointed: %s", pid, st.error().message().c_str()),
			      "a dump of it is refused before anything is locked, and it runs on");
			continue;
		}
		c.add(name, Level::Ok,
		      format("pid %d uses CUDA and shares no GPU memory with other processes: it can be checkpointed", pid));
	}
}

} // namespace

int cmd_check(const Invocation &in)
{
	const ParsedArgs &a = in.args;
	std::vector<pid_t> pids;
	for (const std::string &p : a.positionals) {
		auto pid = parse_pid(p);
		if (!pid)
			return usage_error("check", pid.error().message());
		pids.push_back(*pid);
	}
	std::string criu, libdir, libcuda, containerd;
	a.get("--criu", criu);
	a.get("--containerd", containerd);
	a.get("--libdir", libdir);
	a.get("--libcuda", libcuda);
	bool runtimes = true;
	std::vector<std::string> only_runtimes;
	if (const std::string *v = a.value("--runtimes")) {
		std::stringstream names(*v);
		std::string name;
		while (std::getline(names, name, ',')) {
			if (name == "none")
				runtimes = false;
			else if (name == "runc" || name == "crun" || name == "podman" || name == "containerd")
				only_runtimes.push_back(name);
			else
				return usage_error("check", "--runtimes: unknown runtime '" + name +
								    "' (runc, crun, podman, containerd or none)");
		}
	}

	Checks c;
	Facts facts;
	if (libcuda.empty())
		if (auto options = load_options_from_environment())
			libcuda = options->libcuda; // a broken option file is reported by plugin-options
	check_driver(c, facts, a.has("--require-gpu"), libcuda);
	check_nvml(c);
	check_persistence(c, facts.gpus);
	check_criu_and_plugin(c, facts, criu, libdir);
	check_runtime_lines(c, facts, runtimes, only_runtimes, criu, containerd);
	check_privileges(c);
	check_kernel(c);
	check_thp(c, facts);
	check_processes(c, pids);

	if (a.has("--json"))
		print_json(c, facts);
	else
		print_text(c);
	return c.worst() == Level::Fail ? kExitFailure : kExitOk;
}

} // namespace cuda_criu::cli
