// The plugin's options: environment variables CUDA_CRIU_*, over a config file (podman passes no
// environment to CRIU), over the defaults. README.md (Options) lists them.
#pragma once

#include <map>
#include <string>

#include "base/result.h"
#include "core/device_map.h"

namespace cuda_criu {

// What a dump preflight does when the dump would not fit: in host memory (memory-check,
// core/memory_check.h) or in the image directory (space-check, core/space_check.h).
enum class CheckLevel { Refuse, Warn, Off };
using MemoryCheck = CheckLevel;
using SpaceCheck = CheckLevel;

// Who stores the GPU state of a dump (docs/gpu-image.md): the plugin, in its own files (parallel,
// sparse, checksummed), or CRIU, in its pages images (what CRIU's own CUDA plugin can restore).
enum class GpuImage { Plugin, Criu };

struct Options {
	unsigned lock_timeout_ms = 10000;        // lock-timeout: wait for in-flight CUDA work (CRIU's default)
	unsigned checkpoint_timeout_ms = 600000; // checkpoint-timeout: per process
	unsigned restore_timeout_ms = 600000;    // restore-timeout: per process (restore and unlock)
	unsigned stall_timeout_ms = 30000;       // stall-timeout: a copy without progress this long is hung
	MemoryCheck memory_check = MemoryCheck::Refuse; // memory-check: the dump's host memory preflight
	SpaceCheck space_check = SpaceCheck::Refuse;    // space-check: the dump's image directory preflight
	unsigned parallel = 0;                   // parallel: processes handled at once, 0 = all
	std::string libcuda;                     // libcuda: absolute path of libcuda.so.1 (default: loader's search)
	DeviceMap device_map;                    // device-map: OLD=NEW,... GPU remapping on restore
	GpuImage gpu_image = GpuImage::Plugin;   // gpu-image: plugin or criu
	unsigned io_threads = 0;                 // io-threads: writers/readers of the GPU image, 0 = auto
	int zstd_level = 0;                      // compress: off (0), zstd (1) or zstd:LEVEL; the GPU image's chunks
	bool map_image = true;                   // map-image: auto (true) or off; see core/mapped_restore.h
	// write-while-dumping: auto (true): the GPU image is written while CRIU dumps the tasks, where CRIU waits
	// for it before its inventory (criu-patches/0009); off: in CHECKPOINT_DEVICES, before CRIU goes on.
	bool write_while_dumping = true;
	// huge-pages: auto (true): the driver's checkpoint buffer put on huge pages and populated by the
	// plugin's threads (os/checkpoint_buffer.h); off: left to the driver.
	bool huge_pages = true;
	// ledger, ledger-timeout: the machine's GPU reservation ledger (os/gpu_ledger.h) and how long a restore
	// waits for its lock before it goes on without it; never unbounded (0: one try).
	std::string ledger = "/run/cuda-criu/gpu-reservations";
	unsigned ledger_timeout_ms = 5000;
	std::string config_file;                 // the file that was read, if any
};

// How long past its own timeout (lock-timeout and the others) a driver call may take before the plugin
// or cuda-criu stops waiting for it: the driver honours its timeouts itself, this only guards against a
// driver that does not return at all.
inline constexpr unsigned kDriverGraceMs = 5000;

// Default config file; CUDA_CRIU_CONFIG names another.
inline constexpr const char *kDefaultConfigFile = "/etc/criu/cuda_plugin.conf";

// env: variable lookup (getenv in production). Unknown keys and bad values are errors naming the key.
Result<Options> load_options(const std::map<std::string, std::string> &env);
Result<Options> load_options_from_environment();

} // namespace cuda_criu
