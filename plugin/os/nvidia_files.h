// Which open files and mappings belong to the NVIDIA kernel driver, judged from the file alone (no driver
// call): used for what a process forked after its parent initialised CUDA inherited from the driver.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace cuda_criu {

// The character-device majors /proc/devices registers under an NVIDIA name ("nvidia",
// "nvidia-uvm", "nvidia-caps", "nvidia-frontend", "nvidia-nvswitch", ...). Read once per process.
const std::vector<unsigned> &nvidia_char_majors();

// Whether st is an NVIDIA GPU's own device node (/dev/nvidiaN): a character device of the NVIDIA major
// (195, fixed by the driver), minor below nvidiactl's 255 (the minor is the GPU's device minor). The fake
// GPU makes real nodes of this kind (tests/fakegpu), so no test seam is needed here.
bool is_nvidia_gpu_node(const struct stat &st);

// Whether the file open as fd (stat st) is an NVIDIA device file, GPU node or not:
//  - a character device whose major /proc/devices registers under an NVIDIA name;
//  - TEST SEAM, only while the environment variable FAKEGPU_DIR is set (never in production): a
//    block or character device node directly under $FAKEGPU_DIR/dev/, the fake GPU's stand-in for
//    the driver's mappable nodes (nothing else on a machine without the driver can be mapped the way
//    CRIU cannot dump by itself). See tests/fakegpu and docs/forked-children.md.
// Everything else, including every regular file, is not. Costs one fstat-free test for a regular file.
bool is_nvidia_device_file(int fd, const struct stat &st);

// The path fd was opened with ("/dev/nvidiactl"); empty when unknown.
std::string fd_path(int fd);

// Start addresses of pid's mappings of NVIDIA device files, from /proc/pid/map_files (root only).
std::vector<unsigned long> nvidia_device_mappings(pid_t pid);

// What pid holds of NVIDIA device files, as /proc shows it (root only).
struct DeviceMapping {
	unsigned long start = 0, end = 0, offset = 0;
	std::string perms; // "rw-s"
	std::string path;
};
struct DeviceFd {
	int fd = 0;
	unsigned flags = 0; // /proc/PID/fdinfo "flags:", O_CLOEXEC included
	std::string path;
};
std::vector<DeviceMapping> nvidia_device_mapping_list(pid_t pid);
std::vector<DeviceFd> nvidia_device_fds(pid_t pid);

} // namespace cuda_criu
