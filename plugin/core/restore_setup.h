// The restore's decisions at init(RESTORE), before CRIU restores anything: whether the plugin takes part,
// whether the image can restore on this machine, how the GPU image is checked and put back, and what
// CRIU is asked to map from the image. The ABI layer passes CRIU's calls in (CriuRestoreCalls) and keeps
// only them.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>

#include "base/result.h"
#include "core/guard.h"
#include "core/inherited_devices.h"
#include "core/mapped_restore.h"
#include "core/options.h"
#include "core/restore_session.h"
#include "driver/driver.h"
#include "image/record.h"
#include "os/host.h"

namespace cuda_criu {

// CRIU's calls the set-up makes; each function is empty on a CRIU without it.
struct CriuRestoreCalls {
	int image_dir = -1; // CRIU's image directory (CRIU owns it)
	// criu_check_and_remove_inventory_plugin: whether the inventory lists name, taking it off the list.
	// Empty on a CRIU whose inventory has no list of plugins: every name counts as listed.
	std::function<bool(const char *name)> take_from_inventory;
	MapFromImage map_from_image; // criu-patches/0002
	MapFile map_file;            // criu-patches/0005
	MapFd map_fd;                // criu-patches/0008
	MapFdUserfault map_fd_userfault; // criu-patches/0010, with userfaultfd
	std::function<int(int pid)> userfaultfd; // pid's userfaultfd, once the tasks' memory is restored
};

struct RestoreSetup {
	// The device files of forked children (always, once the image names a CUDA plugin; null otherwise).
	std::unique_ptr<InheritedDevicesRestore> inherited;
	// Whether the plugin restores CUDA processes (false: inactive, it says why in the log).
	bool active = false;
	std::optional<ImageRecord> image; // nullopt: an image of CRIU's own plugin, without cuda-plugin.img
	GpuImageLoad load_gpu;            // empty when CRIU's pages images hold the GPU state unchecked
	bool maps_image = false;          // CRIU was asked to map GPU state from the image
};

// The plugin is inactive for an image whose inventory names no CUDA plugin, and on a machine without the
// NVIDIA driver for an image without cuda-plugin.img. It refuses (an error saying why, to be logged once
// by the caller) a pages file cut short, an unusable image, an image of CUDA processes on a machine
// without the driver or with another driver version, and a GPU image that is missing, incomplete or of
// another dump. host outlives the restore (the GPU image's load uses it).
Result<RestoreSetup> set_up_restore(const Options &options, Host &host, const CriuRestoreCalls &criu);

// The restore session of an active set-up, with a restore guard (forked now: call it while CRIU has no
// threads and has not forked the tasks). criu_fails_on_error: see RestoreSession.
std::unique_ptr<RestoreSession> start_restore(const Options &options, Host &host, DriverSource driver,
					      RestoreSetup setup, bool criu_fails_on_error);

// After the driver restored pid, with the GPU state mapped from the image: warns when pid still maps
// the image's pages files (they must then stay in place while it runs).
void warn_if_image_still_mapped(Host &host, int image_dir, pid_t pid);

} // namespace cuda_criu
