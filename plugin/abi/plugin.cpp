// The C ABI shim: CRIU's plugin descriptor and one short extern "C" function per hook, each running
// its C++ body through guard(). This is the only file that includes CRIU's header.
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <thread>

extern "C" {
#include <criu/criu-plugin.h>
}

#include "abi/criu_host.h"
#include "base/log.h"
#include "core/gpu_plan.h"
#include "core/inherited_devices.h"
#include "core/options.h"
#include "core/session.h"
#include "driver/libcuda.h"
#include "driver/nvml.h"
#include "image/image.h"
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
	CriuHost criu;
	Options options;
	SystemHost host;
	std::unique_ptr<DumpSession> dump;
	std::unique_ptr<RestoreSession> restore;
	std::unique_ptr<InheritedDevicesDump> inherited_dump;       // device files of forked children
	std::unique_ptr<InheritedDevicesRestore> inherited_restore;
	bool inventory_added = false;
	bool image_written = false;
	std::thread driver_warmup; // restore: loads libcuda while CRIU restores memory
	~State()
	{
		if (driver_warmup.joinable())
			driver_warmup.join();
	}
};
State *g_state = nullptr; // one CRIU run: created in init, destroyed in exit

CriuHost g_criu_for_log;

void criu_log_sink(LogLevel level, const char *line)
{
	g_criu_for_log.print_on_level(static_cast<unsigned>(level), "%s", line);
}

// Runs a hook body; nothing escapes into CRIU's C code.
template <typename F>
int guard(const char *hook, F &&body) noexcept
{
	try {
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

int fail(const Error &e)
{
	LOG_ERROR("%s", e.message().c_str());
	return -(e.errno_value() > 0 ? e.errno_value() : EIO);
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

int init_dump(State &s)
{
	// Independent of the driver's presence: a child keeps its inherited device files whatever happens.
	s.inherited_dump = std::make_unique<InheritedDevicesDump>(s.criu.get_image_dir());
	if (!nvidia_driver_present(s.options.libcuda)) {
		LOG_INFO("no NVIDIA driver on this machine; CUDA plugin inactive");
		return 0;
	}
	if (s.criu.set_compel_interrupt_only_mode)
		s.criu.set_compel_interrupt_only_mode();
	else
		LOG_WARN("this CRIU cannot seize in interrupt-only mode: a CUDA process in a frozen cgroup cannot be "
			 "checkpointed");
	std::string libcuda = s.options.libcuda;
	unsigned timeout_ms = s.options.restore_timeout_ms;
	s.dump = std::make_unique<DumpSession>(s.options, s.host, driver_source(s.options),
					       [libcuda, timeout_ms] { return DumpGuard::start(libcuda, timeout_ms); });
	LOG_INFO("ready to dump CUDA processes (lock timeout %.1f s)", s.options.lock_timeout_ms / 1000.0);
	return 0;
}

int init_restore(State &s)
{
	bool listed = true; // the inventory names a CUDA plugin (or predates the list)
	if (s.criu.check_and_remove_inventory_plugin)
		listed = s.criu.check_and_remove_inventory_plugin(CR_PLUGIN_DESC.name, std::strlen(CR_PLUGIN_DESC.name));
	if (!listed) {
		LOG_INFO("the image holds no CUDA process; CUDA plugin inactive");
		return 0;
	}
	// Read now: the restored tasks answer from this copy, forked before their fds are rearranged.
	s.inherited_restore = std::make_unique<InheritedDevicesRestore>(s.criu.get_image_dir());
	if (auto st = s.inherited_restore->load(); !st)
		return fail(st.error());
	auto image = read_image(s.criu.get_image_dir());
	if (!image)
		return fail(std::move(image).error().context("%s", "cannot restore: the CUDA plugin's image is unusable"));
	bool driver = nvidia_driver_present(s.options.libcuda);
	if (image->has_value() && !driver)
		return fail(make_error(ENODEV,
				       "the image holds %zu CUDA process(es) (dumped with NVIDIA driver %s) but this "
				       "machine has no NVIDIA driver: restore on a machine with the driver and GPUs",
				       (*image)->processes.size(), (*image)->driver_version.c_str()));
	if (!driver) {
		LOG_INFO("no NVIDIA driver on this machine; CUDA plugin inactive");
		return 0;
	}
	if (image->has_value())
		if (auto st = check_driver_version(**image, kernel_driver_version()); !st)
			return fail(std::move(st).error().context("%s", "cannot restore"));
	// Forked now, while CRIU has no threads and has not forked the tasks yet (nor set its SIGCHLD handler).
	auto guard = RestoreGuard::start();
	if (!guard)
		LOG_WARN("no guard for this restore (%s): if CRIU dies mid-restore, a restored CUDA process may run on "
			 "without its GPU state; check with cuda-criu status",
			 guard.error().message().c_str());
	s.restore = std::make_unique<RestoreSession>(s.options, s.host, driver_source(s.options), std::move(*image),
						     s.criu.resume_late_errors_fatal,
						     guard ? std::move(*guard) : RestoreGuard());
	LOG_INFO("ready to restore CUDA processes%s", image->has_value() ? "" : " (image without cuda-plugin.img)");
	return 0;
}

} // namespace
} // namespace cuda_criu

using namespace cuda_criu;

extern "C" {

static int cuda_plugin_init(int stage)
{
	return guard("init", [&] {
		g_criu_for_log = CriuHost::lookup();
		if (g_criu_for_log.print_on_level)
			set_log_sink(criu_log_sink);
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
	guard("exit", [&] {
		std::unique_ptr<State> s(std::exchange(g_state, nullptr));
		if (!s)
			return 0;
		if (stage == CR_PLUGIN_STAGE__DUMP && s->dump && s->dump->has_cuda_processes()) {
			std::optional<bool> keep = s->criu.tasks_keep_running();
			if (!keep)
				LOG_WARN("cannot tell whether CRIU leaves the tasks running; assuming it does");
			Status st = s->dump->finish(ret != 0, keep.value_or(true));
			if (!st)
				LOG_ERROR("%s", st.error().message().c_str());
			if (ret == 0)
				LOG_INFO("%s", s->dump->summary().c_str());
		}
		if (stage == CR_PLUGIN_STAGE__RESTORE && s->restore)
			LOG_INFO("%s", s->restore->summary().c_str());
		return 0;
	});
}

static int cuda_plugin_pause_devices(int pid)
{
	return guard("PAUSE_DEVICES", [&] {
		if (!g_state || !g_state->dump)
			return -ENOTSUP;
		State &s = *g_state;
		auto r = s.dump->pause(pid);
		if (!r)
			return fail(r.error());
		if (!*r)
			return -ENOTSUP;
		return add_to_inventory(s);
	});
}

static int cuda_plugin_checkpoint_devices(int pid)
{
	return guard("CHECKPOINT_DEVICES", [&] {
		if (!g_state || !g_state->dump)
			return -ENOTSUP;
		State &s = *g_state;
		auto r = s.dump->checkpoint(pid);
		if (!r)
			return fail(r.error());
		if (!*r)
			return -ENOTSUP;
		if (auto st = check_no_device_mappings(pid); !st)
			return fail(st.error());
		if (!s.image_written) {
			s.image_written = true;
			if (auto st = write_image(s.criu.get_image_dir(), s.dump->image_record()); !st)
				return fail(std::move(st).error().context("%s", "cannot write the CUDA plugin's image"));
		}
		return 0;
	});
}

// CRIU 4.2+: called once the restored tasks exist. From here on no task is forked from CRIU's own
// process, so a thread of ours (and libcuda's, started by cuInit) cannot be caught in a fork: load the
// driver now, in parallel with CRIU restoring memory, instead of at the first RESUME_DEVICES_LATE.
static int cuda_plugin_post_forking()
{
	guard("POST_FORKING", [&] {
		if (g_state && g_state->restore && !g_state->driver_warmup.joinable()) {
			std::string path = g_state->options.libcuda;
			g_state->driver_warmup = std::thread([path] {
				(void)load_libcuda(path);
				(void)load_nvml(); // for the free-memory check of the GPU plan
			});
		}
		return 0;
	});
	return -ENOTSUP; // not a claim on anything: other plugins' POST_FORKING hooks run too
}

static int cuda_plugin_resume_devices_late(int pid)
{
	return guard("RESUME_DEVICES_LATE", [&] {
		if (!g_state || !g_state->restore)
			return -ENOTSUP;
		if (g_state->driver_warmup.joinable())
			g_state->driver_warmup.join();
		auto r = g_state->restore->resume(pid);
		if (!r)
			return fail(r.error());
		return *r ? 0 : -ENOTSUP;
	});
}

// The next four hooks serve processes forked after CUDA started (core/inherited_devices.h). Each
// answers -ENOTSUP for anything not an NVIDIA device file, so other plugins (amdgpu) still get theirs.
static int cuda_plugin_dump_ext_file(int fd, int id)
{
	return guard("DUMP_EXT_FILE", [&] {
		if (!g_state || !g_state->inherited_dump)
			return -ENOTSUP;
		auto r = g_state->inherited_dump->claim_file(fd, static_cast<uint32_t>(id));
		if (!r)
			return fail(r.error());
		return *r ? add_to_inventory(*g_state) : -ENOTSUP;
	});
}

static int cuda_plugin_restore_ext_file(int id)
{
	return guard("RESTORE_EXT_FILE", [&] {
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
	return guard("HANDLE_DEVICE_VMA", [&] {
		Result<bool> r = g_state && g_state->inherited_dump
					 ? g_state->inherited_dump->claim_mapping(fd, *st)
					 : Result<bool>(is_nvidia_device_file(fd, *st));
		if (!r)
			return fail(r.error());
		if (!*r)
			return -ENOTSUP;
		return g_state ? add_to_inventory(*g_state) : 0;
	});
}

// path: CRIU's, read only. *plugin_fd receives a new fd that CRIU maps instead of opening path.
static int cuda_plugin_update_vma_map(const char *path, const uint64_t addr, const uint64_t old_pgoff,
				      uint64_t *new_pgoff, int *plugin_fd)
{
	return guard("UPDATE_VMA_MAP", [&] {
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
	"cuda_plugin",
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
