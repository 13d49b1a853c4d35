// CRIU's internal functions that the plugin may use, looked up at run time (criu is linked with
// -rdynamic). Each is optional: a CRIU without it loses only what the comment says.
#pragma once

#include <optional>

namespace cuda_criu {

struct CriuSymbols {
	// The image directory fd (CRIU's public plugin API).
	int (*get_image_dir)() = nullptr;
	// Routes the plugin's log into CRIU's log (else: stderr).
	void (*print_on_level)(unsigned int level, const char *fmt, ...) = nullptr;
	// Records "cuda_plugin" in the inventory, so that restore insists on a CUDA plugin (CRIU 4.1+).
	int (*add_inventory_plugin)(const char *name) = nullptr;
	// Takes our entry off the inventory's list at restore (CRIU 4.1+; else restore fails with
	// "Missing required plugin").
	bool (*check_and_remove_inventory_plugin)(const char *name, size_t n) = nullptr;
	// Makes CRIU seize with PTRACE_INTERRUPT rather than the freezer cgroup, so that a frozen cgroup
	// cannot hold the driver's restore thread (CRIU 4.0+).
	void (*set_compel_interrupt_only_mode)() = nullptr;
	// CRIU's options; its first member, final_state, has been first in every CRIU 4.x.
	const int *opts_final_state = nullptr;
	// Set by criu-patches/: CRIU fails a restore when RESUME_DEVICES_LATE fails.
	bool resume_late_errors_fatal = false;
	// Set by criu-patches/: maps private anonymous pages from the pages image at restore
	// (core/mapped_restore.h); 0 or -errno.
	int (*restore_map_from_image)(int pid, unsigned long start, unsigned long end) = nullptr;
	// Set by criu-patches/0004: CRIU leaves pages the plugin stored itself out of its pages images
	// (core/gpu_store.h); 0 or -errno. Without it the GPU state stays in CRIU's pages images.
	int (*dump_skip_pages)(int pid, unsigned long start, unsigned long end) = nullptr;
	// Set by criu-patches/0005: maps pages from one of the plugin's files at restore; 0 or -errno.
	// Without it the plugin writes its GPU image into the restored processes.
	int (*restore_map_file)(int pid, unsigned long start, unsigned long end, const char *name,
				unsigned long offset) = nullptr;
	// Set by criu-patches/0008: the same from a file the plugin holds open (a memfd); 0 or -errno.
	int (*restore_map_fd)(int pid, unsigned long start, unsigned long end, int fd, unsigned long offset) = nullptr;
	// Set by criu-patches/0010: pid's runs from the plugin's fds come in on demand, through a userfaultfd
	// the plugin takes once the tasks' memory is restored (a new fd the plugin closes, or -errno).
	int (*restore_map_fd_userfault)(int pid) = nullptr;
	int (*restore_userfaultfd)(int pid) = nullptr;
	// Set by criu-patches/0009: CRIU calls fn(arg) once it has dumped every task, before its inventory,
	// and fails the dump when it returns non-zero; 0 or -errno. Without it the plugin writes its GPU image
	// in CHECKPOINT_DEVICES, before CRIU dumps the tasks.
	int (*dump_before_inventory)(int (*fn)(void *arg), void *arg) = nullptr;

	// Set by criu-patches/0007: a dump that succeeded is reported failed once the plugin sets it (its
	// exit hook could not return a task to the state it was found in). Without it CRIU says success.
	int *dump_failed_late = nullptr;

	static CriuSymbols lookup();

	// What happens to the dumped tasks after exit(DUMP): nullopt when unknown.
	std::optional<bool> tasks_keep_running() const;
};

} // namespace cuda_criu
