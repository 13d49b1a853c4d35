// The C ABI shim: CRIU's plugin descriptor and one short extern "C" function per hook, each running
// its C++ body through hook_barrier(). This is the only file that includes CRIU's header.
#include <dlfcn.h>
#include <link.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include <criu/criu-plugin.h>
}

#include "abi/criu_symbols.h"
#include "base/clock.h"
#include "base/log.h"
#include "core/criu_errno.h"
#include "core/background.h"
#include "core/dump_session.h"
#include "core/inherited_devices.h"
#include "core/options.h"
#include "core/restore_session.h"
#include "core/restore_setup.h"
#include "driver/libcuda.h"
#include "driver/nvml.h"
#include "image/gpu_image.h"
#include "image/image.h"
#include "os/fs_context.h"
#include "os/host.h"
#include "os/nvidia_files.h"

namespace cuda_criu {
namespace {

// CRIU 4.0 and 4.1 refuse a plugin whose max_hooks exceeds 12 ("Corrupted plugin"); 4.2 adds
// POST_FORKING (12). The descriptor says 12, and a constructor raises it to 13 inside a CRIU whose hook
// table has room for POST_FORKING (see offer_post_forking).
constexpr unsigned kMaxHooks = CR_PLUGIN_HOOK__CHECKPOINT_DEVICES + 1;
static_assert(CR_PLUGIN_HOOK__DUMP_EXT_FILE == 2 && CR_PLUGIN_HOOK__RESTORE_EXT_FILE == 3 &&
	      CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA == 7 && CR_PLUGIN_HOOK__UPDATE_VMA_MAP == 8 &&
	      CR_PLUGIN_HOOK__RESUME_DEVICES_LATE == 9 && CR_PLUGIN_HOOK__PAUSE_DEVICES == 10 &&
	      CR_PLUGIN_HOOK__CHECKPOINT_DEVICES == 11 && CR_PLUGIN_HOOK__POST_FORKING == 12);

struct State {
	CriuSymbols criu;
	Options options;
	SystemHost host;
	std::unique_ptr<DumpSession> dump;
	std::unique_ptr<RestoreSession> restore;
	std::unique_ptr<InheritedDevicesDump> inherited_dump;       // device files of forked children
	std::unique_ptr<InheritedDevicesRestore> inherited_restore;
	bool inventory_added = false;
	bool image_written = false;
	std::shared_ptr<Background> gpu_write; // dump: the GPU image, written while CRIU dumps the tasks
	Status gpu_write_status;               // its result, once gpu_write is done
	bool maps_image = false; // restore: CRIU was asked to map GPU state from the image
	std::shared_ptr<Background> driver_load; // restore: libcuda and NVML loaded while CRIU restores memory
};
State *g_state = nullptr; // one CRIU run: created in init, destroyed in exit

CriuSymbols g_criu_for_log;

void criu_log_sink(LogLevel level, const char *line)
{
	g_criu_for_log.print_on_level(static_cast<unsigned>(level), "%s", line);
}

// Runs a hook body; nothing escapes into CRIU's C code.
template <typename F>
int hook_barrier(const char *hook, F &&body) noexcept
{
	try {
		log_flush_queued(); // lines of our threads since the last hook
		return body();
	} catch (const std::bad_alloc &) {
		LOG_ERROR("%s: out of memory", hook);
		return -ENOMEM;
	} catch (const std::exception &e) {
		LOG_ERROR("%s: internal error: %s", hook, e.what());
		return -EIO;
	} catch (...) {
		LOG_ERROR("%s: internal error", hook);
		return -EIO;
	}
}

// Lists the plugin in CRIU's inventory so that the restore loads it (once per dump).
int add_to_inventory(State &s)
{
	if (s.inventory_added || !s.criu.add_inventory_plugin)
		return 0;
	if (s.criu.add_inventory_plugin(CR_PLUGIN_DESC.name)) {
		LOG_ERROR("cannot add %s to CRIU's inventory", CR_PLUGIN_DESC.name);
		return -ENOMEM;
	}
	s.inventory_added = true;
	return 0;
}

// Marks an image whose GPU state the plugin stored itself (image/gpu_image.h: kGpuImageInventoryName).
int add_gpu_image_to_inventory(State &s)
{
	if (!s.criu.add_inventory_plugin || s.criu.add_inventory_plugin(kGpuImageInventoryName) == 0)
		return 0;
	LOG_ERROR("cannot add the GPU image's entry to CRIU's inventory");
	return -ENOMEM;
}

// Every failure a hook reports goes through here: -ENOTSUP is reserved for "not mine".
int fail(const Error &e)
{
	LOG_ERROR("%s", e.message().c_str());
	return -failure_errno(e);
}

// Abandoned driver calls (timeouts) may still run on our threads after CRIU's dlclose: stay mapped.
void pin_self()
{
	Dl_info info;
	if (dladdr(reinterpret_cast<void *>(&pin_self), &info) && info.dli_fname)
		dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

DriverSource driver_source(const Options &o)
{
	std::string path = o.libcuda;
	return [path] { return load_libcuda(path); };
}

// CRIU calls PAUSE_DEVICES inside its seize alarm, alarm(opts.timeout) in collect_pstree (--timeout,
// 10 s by default), and its SIGALRM handler BUG()s five seconds after the alarm fired. The timer's
// remaining time is what every pause left in this dump may still spend, whatever CRIU and earlier
// pauses (the driver load included) already took. 0: no alarm armed (a CRIU that set none).
unsigned seize_alarm_left_ms()
{
	itimerval it{};
	if (getitimer(ITIMER_REAL, &it) != 0)
		return 0;
	uint64_t ms = static_cast<uint64_t>(it.it_value.tv_sec) * 1000 + static_cast<uint64_t>(it.it_value.tv_usec) / 1000;
	if (ms == 0 && it.it_value.tv_usec > 0)
		ms = 1;
	return static_cast<unsigned>(std::min<uint64_t>(ms, ~0u));
}

int init_dump(State &s)
{
	// Independent of the driver's presence: a process holding NVIDIA device files is judged whatever
	// happens, and without the driver none may keep them.
	s.inherited_dump = std::make_unique<InheritedDevicesDump>(
		s.host, s.criu.get_image_dir(), [&s](pid_t pid) -> Status {
			if (s.dump)
				return s.dump->stand_ins_allowed(pid);
			return make_error(EBUSY,
					  "pid %d holds NVIDIA device files, but the CUDA plugin is inactive: no NVIDIA driver "
					  "found (%s); its GPU state cannot be saved (check nvidia-smi, and CUDA_CRIU_LIBCUDA "
					  "if set)",
					  pid,
					  s.options.libcuda.empty() ? "/proc/driver/nvidia/gpus is empty or missing"
								    : ("no file " + s.options.libcuda).c_str());
		});
	if (!s.host.nvidia_driver_present(s.options.libcuda)) {
		LOG_INFO("no NVIDIA driver on this machine; CUDA plugin inactive");
		return 0;
	}
	if (s.criu.set_compel_interrupt_only_mode)
		s.criu.set_compel_interrupt_only_mode();
	else
		LOG_WARN("this CRIU cannot seize in interrupt-only mode: a CUDA process in a frozen cgroup cannot be "
			 "checkpointed");
	unsigned timeout_ms = s.options.restore_timeout_ms;
	s.dump = std::make_unique<DumpSession>(s.options, s.host, driver_source(s.options),
					       [source = driver_source(s.options), timeout_ms] {
						       return DumpGuard::start(source, timeout_ms);
					       },
					       seize_alarm_left_ms, s.criu.get_image_dir());
	LOG_INFO("ready to dump CUDA processes (version %s, lock timeout %.1f s)", CUDA_CRIU_VERSION,
		 s.options.lock_timeout_ms / 1000.0);
	return 0;
}

// The restore's CRIU calls; core/restore_setup.h decides with them.
CriuRestoreCalls restore_calls(const CriuSymbols &criu)
{
	CriuRestoreCalls calls;
	calls.image_dir = criu.get_image_dir();
	if (criu.check_and_remove_inventory_plugin)
		calls.take_from_inventory = [f = criu.check_and_remove_inventory_plugin](const char *name) {
			return f(name, std::strlen(name));
		};
	if (criu.restore_map_from_image)
		calls.map_from_image = criu.restore_map_from_image;
	if (criu.restore_map_file)
		calls.map_file = [f = criu.restore_map_file](int pid, uint64_t start, uint64_t end, const char *name,
							     uint64_t off) { return f(pid, start, end, name, off); };
	if (criu.restore_map_fd)
		calls.map_fd = [f = criu.restore_map_fd](int pid, uint64_t start, uint64_t end, int fd, uint64_t off) {
			return f(pid, start, end, fd, off);
		};
	// Both or neither: a userfaultfd the plugin could not take would leave pages nobody maps.
	if (criu.restore_map_fd_userfault && criu.restore_userfaultfd) {
		calls.map_fd_userfault = criu.restore_map_fd_userfault;
		calls.userfaultfd = criu.restore_userfaultfd;
	}
	return calls;
}

int init_restore(State &s)
{
	auto setup = set_up_restore(s.options, s.host, restore_calls(s.criu));
	if (!setup)
		return fail(setup.error());
	s.inherited_restore = std::move(setup->inherited);
	if (!setup->active)
		return 0;
	s.maps_image = setup->maps_image;
	// Forked now, while CRIU has no threads and has not forked the tasks yet (nor set its SIGCHLD handler).
	s.restore = start_restore(s.options, s.host, driver_source(s.options), std::move(*setup),
				  s.criu.resume_late_errors_fatal);
	return 0;
}

// A hook's answer to a claim: 0 for ours, -ENOTSUP for what is not, the failure otherwise.
int answer(const Result<bool> &claim)
{
	if (!claim)
		return fail(claim.error());
	return *claim ? 0 : -ENOTSUP;
}

// A dump hook that claims what is ours through one part of the state: -ENOTSUP without it, else the
// claim's answer, the plugin listed in CRIU's inventory once it claimed something.
template <typename Part, typename F>
int claim_hook(const char *hook, std::unique_ptr<Part> State::*part, F claim)
{
	return hook_barrier(hook, [&] {
		if (!g_state || !(g_state->*part))
			return -ENOTSUP;
		if (int rc = answer(claim(*(g_state->*part))))
			return rc;
		return add_to_inventory(*g_state);
	});
}

} // namespace
} // namespace cuda_criu

using namespace cuda_criu;

extern "C" {

static int cuda_plugin_init(int stage)
{
	return hook_barrier("init", [&] {
		g_criu_for_log = CriuSymbols::lookup();
		if (g_criu_for_log.print_on_level) {
			set_log_sink(criu_log_sink);
			log_only_from_this_thread(); // CRIU's log is not thread-safe
		}
		delete g_state;
		g_state = nullptr;
		if (stage == CR_PLUGIN_STAGE__PRE_DUMP) {
			LOG_INFO("pre-dump: GPU state is not pre-dumped; CUDA plugin inactive");
			return 0;
		}
		auto options = load_options_from_environment();
		if (!options)
			return fail(std::move(options).error().context("%s", "bad CUDA plugin option"));
		pin_self();
		if (!g_criu_for_log.get_image_dir)
			return fail(make_error(ENOSYS, "%s", "the host program is not CRIU 4.x (no criu_get_image_dir)"));
		auto s = std::make_unique<State>();
		s->criu = g_criu_for_log;
		s->options = std::move(*options);
		int ret = stage == CR_PLUGIN_STAGE__DUMP ? init_dump(*s) : init_restore(*s);
		if (ret == 0)
			g_state = s.release();
		return ret;
	});
}

static void cuda_plugin_fini(int stage, int ret)
{
	hook_barrier("exit", [&] {
		std::unique_ptr<State> s(std::exchange(g_state, nullptr));
		if (!s)
			return 0;
		if (s->gpu_write) { // the dump failed before CRIU waited for the GPU image's write
			s->gpu_write->wait(UINT_MAX);
			s->gpu_write.reset();
			log_flush_queued();
			if (!s->gpu_write_status)
				LOG_ERROR("%s", s->gpu_write_status.error().message().c_str());
		}
		if (stage == CR_PLUGIN_STAGE__DUMP && s->dump && s->dump->has_cuda_processes()) {
			std::optional<bool> keep = s->criu.tasks_keep_running();
			if (!keep)
				LOG_WARN("cannot tell whether CRIU leaves the tasks running; assuming it does");
			Status st = s->dump->finish(ret != 0, keep.value_or(true));
			if (!st)
				LOG_ERROR("%s", st.error().message().c_str());
			if (!st && ret == 0 && s->criu.dump_failed_late)
				*s->criu.dump_failed_late = 1; // CRIU reports the dump failed (criu-patches/0007)
			else if (!st && ret == 0)
				LOG_ERROR("%s", "this CRIU reports the dump as successful although the processes above are not "
						"back as they were (apply criu-patches/ to make it fail)");
			if (ret == 0 && st)
				LOG_INFO("%s", s->dump->summary().c_str());
		}
		if (stage == CR_PLUGIN_STAGE__RESTORE && s->restore)
			LOG_INFO("%s", s->restore->summary().c_str());
		log_flush_queued();
		return 0;
	});
}

static int cuda_plugin_pause_devices(int pid)
{
	return claim_hook("PAUSE_DEVICES", &State::dump, [pid](DumpSession &d) { return d.pause(pid); });
}

// cuda-plugin.img, once the GPU state is stored (its ids are in it).
static int write_plugin_image(State &s)
{
	if (auto st = write_image(s.criu.get_image_dir(), s.dump->image_record()); !st)
		return fail(std::move(st).error().context("%s", "cannot write the CUDA plugin's image"));
	return 0;
}

// CRIU, once it has dumped every task and before its inventory (criu-patches/0009): waits for the GPU
// image's write, then writes cuda-plugin.img; a failed write fails the dump while the tasks are still
// CRIU's to let go as they were.
static int cuda_plugin_before_inventory(void *)
{
	return hook_barrier("before the inventory", [&] {
		if (!g_state || !g_state->gpu_write)
			return 0;
		State &s = *g_state;
		uint64_t t0 = now_us();
		while (!s.gpu_write->done_within(500))
			log_flush_queued(); // the write's progress lines, as they come
		s.gpu_write.reset();
		log_flush_queued();
		if (!s.gpu_write_status)
			return fail(s.gpu_write_status.error());
		LOG_INFO("GPU image: CRIU waited %.3f s for its write once it had dumped the processes",
			 static_cast<double>(now_us() - t0) / 1e6);
		return write_plugin_image(s);
	});
}

// Writes the GPU image on a thread of ours while CRIU dumps the tasks (their memory, files, namespaces:
// nothing of it needs the GPU image), where this CRIU waits for it before its inventory. false: it would
// not wait; write it now.
static bool start_gpu_write(State &s)
{
	if (!s.options.write_while_dumping || !s.criu.dump_before_inventory ||
	    s.criu.dump_before_inventory(cuda_plugin_before_inventory, nullptr) != 0)
		return false;
	DumpSession *dump = s.dump.get();
	Status *result = &s.gpu_write_status;
	s.gpu_write = Background::start(
		use_own_fs_context,
		[dump, result] {
			try { // nothing may escape a thread inside CRIU
				*result = dump->write_gpu_image();
			} catch (const std::exception &e) {
				*result = make_error(EIO, "cannot store the GPU image: internal error: %s", e.what());
			} catch (...) {
				*result = make_error(EIO, "%s", "cannot store the GPU image: internal error");
			}
		},
		5000);
	LOG_INFO("%s", "GPU image: written while CRIU dumps the processes");
	return true;
}

static int cuda_plugin_checkpoint_devices(int pid)
{
	return hook_barrier("CHECKPOINT_DEVICES", [&] {
		if (!g_state || !g_state->dump)
			return -ENOTSUP;
		State &s = *g_state;
		if (int rc = answer(s.dump->checkpoint(pid)))
			return rc;
		if (auto st = check_no_device_mappings(s.host, pid); !st)
			return fail(st.error());
		if (!s.image_written) {
			s.image_written = true;
			SkipPages skip;
			if (s.criu.dump_skip_pages)
				skip = [f = s.criu.dump_skip_pages](pid_t p, uint64_t start, uint64_t end) {
					return f(p, start, end);
				};
			auto own = s.dump->leave_gpu_state_out(s.criu.get_image_dir(), skip);
			if (!own)
				return fail(own.error());
			if (*own) {
				if (int rc = add_gpu_image_to_inventory(s))
					return rc;
				if (start_gpu_write(s))
					return 0; // cuda-plugin.img once the GPU image is written (cuda_plugin_before_inventory)
				if (auto st = s.dump->write_gpu_image(); !st)
					return fail(st.error());
			}
			return write_plugin_image(s);
		}
		return 0;
	});
}

// CRIU 4.2+: called once the restored tasks exist. From here on no task is forked from CRIU's own
// process, so a thread of ours (and libcuda's, started by cuInit) cannot be caught in a fork: load the
// driver and check the GPU image CRIU maps now, in parallel with CRIU restoring memory, instead of at the
// first RESUME_DEVICES_LATE.
static int cuda_plugin_post_forking()
{
	hook_barrier("POST_FORKING", [&] {
		ThreadsAllowed threads; // CRIU may have joined a pod's pid namespace to fork the tasks into
		if (g_state && g_state->restore)
			g_state->restore->start_check(use_own_fs_context);
		if (g_state && g_state->restore && !g_state->driver_load) {
			std::string path = g_state->options.libcuda;
			g_state->driver_load = Background::start(
				use_own_fs_context,
				[path] {
					(void)load_libcuda(path);
					(void)load_nvml(); // for the free-memory check of the GPU plan
				},
				5000);
		}
		return 0;
	});
	return -ENOTSUP; // not a claim on anything: other plugins' POST_FORKING hooks run too
}

static int cuda_plugin_resume_devices_late(int pid)
{
	return hook_barrier("RESUME_DEVICES_LATE", [&] {
		if (!g_state || !g_state->restore)
			return -ENOTSUP;
		ThreadsAllowed threads; // the driver's calls run on threads (see POST_FORKING)
		RestoreSession &restore = *g_state->restore;
		// A failure before the session decides leaves every CUDA process checkpointed: the session still
		// makes sure none of them runs (abandon).
		std::optional<Error> outside;
		Result<bool> r = false;
		try {
			if (g_state->driver_load && !g_state->driver_load->wait(kDriverLoadTimeoutMs))
				outside = make_error(ETIMEDOUT,
						     "restore pid %d: loading the CUDA driver (cuInit, NVML) gave no answer "
						     "within %u s; check the NVIDIA driver (nvidia-smi)",
						     pid, kDriverLoadTimeoutMs / 1000);
			else
				r = restore.resume(pid);
		} catch (const std::bad_alloc &) {
			outside = make_error(ENOMEM, "restore pid %d: out of memory", pid);
		} catch (const std::exception &e) {
			outside = make_error(EIO, "restore pid %d: internal error: %s", pid, e.what());
		}
		if (outside) {
			restore.abandon(pid, *outside);
			return fail(*outside);
		}
		if (!r) // logged by the session, with every other process that failed
			return fail(make_error(r.error().errno_value(), "restore of pid %d failed (see above)", pid));
		if (*r && g_state->maps_image)
			warn_if_image_still_mapped(g_state->host, g_state->criu.get_image_dir(), pid);
		return *r ? 0 : -ENOTSUP;
	});
}

// The next four hooks serve processes forked after CUDA started (core/inherited_devices.h). Each
// answers -ENOTSUP for anything not an NVIDIA device file, so other plugins (amdgpu) still get theirs.
static int cuda_plugin_dump_ext_file(int fd, int id)
{
	return claim_hook("DUMP_EXT_FILE", &State::inherited_dump,
			  [fd, id](InheritedDevicesDump &d) { return d.claim_file(fd, static_cast<uint32_t>(id)); });
}

static int cuda_plugin_restore_ext_file(int id)
{
	return hook_barrier("RESTORE_EXT_FILE", [&] {
		if (!g_state || !g_state->inherited_restore)
			return -ENOTSUP;
		auto r = g_state->inherited_restore->file_fd(static_cast<uint32_t>(id));
		if (!r)
			return fail(r.error());
		return *r ? **r : -ENOTSUP; // the fd, now CRIU's
	});
}

// fd and st: the mapped file, opened by CRIU (CRIU owns both). Pre-dump has no state: the claim alone
// (a shared device mapping has no pages to pre-dump) is the answer there.
static int cuda_plugin_handle_device_vma(int fd, const struct stat *st)
{
	return hook_barrier("HANDLE_DEVICE_VMA", [&] {
		if (int rc = answer(g_state && g_state->inherited_dump ? g_state->inherited_dump->claim_mapping(fd, *st)
								       : Result<bool>(is_nvidia_device_file(fd, *st))))
			return rc;
		return g_state ? add_to_inventory(*g_state) : 0;
	});
}

// path: CRIU's, read only. *plugin_fd receives a new fd that CRIU maps instead of opening path.
static int cuda_plugin_update_vma_map(const char *path, const uint64_t addr, const uint64_t old_pgoff,
				      uint64_t *new_pgoff, int *plugin_fd)
{
	return hook_barrier("UPDATE_VMA_MAP", [&] {
		if (!g_state || !g_state->inherited_restore)
			return -ENOTSUP;
		auto r = g_state->inherited_restore->mapping_fd(path);
		if (!r)
			return fail(std::move(r).error().context("mapping at %#llx", static_cast<unsigned long long>(addr)));
		if (!*r)
			return -ENOTSUP;
		(void)old_pgoff;
		*new_pgoff = 0;
		*plugin_fd = **r;
		return 1;
	});
}

// Owned by this library; CRIU reads it after dlopen and never writes it.
__attribute__((visibility("default"))) cr_plugin_desc_t CR_PLUGIN_DESC = {
	kPluginName,
	cuda_plugin_init,
	cuda_plugin_fini,
	CRIU_PLUGIN_VERSION,
	kMaxHooks,
	{
		nullptr,
		nullptr,
		reinterpret_cast<void *>(cuda_plugin_dump_ext_file),    // 2
		reinterpret_cast<void *>(cuda_plugin_restore_ext_file), // 3
		nullptr,
		nullptr,
		nullptr,
		reinterpret_cast<void *>(cuda_plugin_handle_device_vma), // 7
		reinterpret_cast<void *>(cuda_plugin_update_vma_map),    // 8
		reinterpret_cast<void *>(cuda_plugin_resume_devices_late), // 9
		reinterpret_cast<void *>(cuda_plugin_pause_devices),       // 10
		reinterpret_cast<void *>(cuda_plugin_checkpoint_devices),  // 11
	},
};

// Runs at dlopen, before CRIU reads the descriptor. CRIU's cr_plugin_ctl holds one list head per hook
// after its own list head: its size tells how many hooks this CRIU knows, without guessing its version.
__attribute__((constructor)) static void offer_post_forking()
{
	void *ctl = dlsym(RTLD_DEFAULT, "cr_plugin_ctl");
	Dl_info info;
	void *extra = nullptr; // the symbol table entry, owned by the loader
	if (!ctl || !dladdr1(ctl, &info, &extra, RTLD_DL_SYMENT) || !extra)
		return;
	const auto *sym = static_cast<const ElfW(Sym) *>(extra);
	size_t hooks = sym->st_size / (2 * sizeof(void *)) - 1;
	if (hooks > CR_PLUGIN_HOOK__POST_FORKING) {
		CR_PLUGIN_DESC.hooks[CR_PLUGIN_HOOK__POST_FORKING] = reinterpret_cast<void *>(cuda_plugin_post_forking);
		CR_PLUGIN_DESC.max_hooks = CR_PLUGIN_HOOK__POST_FORKING + 1;
	}
}

} // extern "C"
