#include "abi/criu_symbols.h"

#include <dlfcn.h>

namespace cuda_criu {

template <typename T>
static void find(T &slot, const char *name)
{
	slot = reinterpret_cast<T>(dlsym(RTLD_DEFAULT, name));
}

CriuSymbols CriuSymbols::lookup()
{
	CriuSymbols h;
	find(h.get_image_dir, "criu_get_image_dir");
	find(h.print_on_level, "print_on_level");
	find(h.add_inventory_plugin, "add_inventory_plugin");
	find(h.check_and_remove_inventory_plugin, "check_and_remove_inventory_plugin");
	find(h.set_compel_interrupt_only_mode, "set_compel_interrupt_only_mode");
	find(h.opts_final_state, "opts");
	find(h.restore_map_from_image, "criu_restore_map_from_image");
	find(h.dump_skip_pages, "criu_dump_skip_pages");
	find(h.restore_map_file, "criu_restore_map_file");
	find(h.restore_map_fd, "criu_restore_map_fd");
	find(h.restore_map_fd_userfault, "criu_restore_map_fd_userfault");
	find(h.restore_userfaultfd, "criu_restore_userfaultfd");
	find(h.dump_before_inventory, "criu_dump_before_inventory");
	find(h.dump_failed_late, "criu_dump_plugin_failed_late");
	h.resume_late_errors_fatal = dlsym(RTLD_DEFAULT, "criu_resume_devices_late_errors_fatal") != nullptr;
	return h;
}

std::optional<bool> CriuSymbols::tasks_keep_running() const
{
	// CRIU's task states: TASK_ALIVE 1 (--leave-running), TASK_DEAD 2 (the default), TASK_STOPPED 3
	// (--leave-stopped: the tasks run again once someone sends SIGCONT).
	if (!opts_final_state)
		return std::nullopt;
	switch (*opts_final_state) {
	case 1:
	case 3:
		return true;
	case 2:
		return false;
	default:
		return std::nullopt;
	}
}

} // namespace cuda_criu
