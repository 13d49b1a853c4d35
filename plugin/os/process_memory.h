// Copies between this process and another's memory (process_vm_readv/writev): the plugin's GPU image
// reads the driver's copy of the GPU state out of a stopped process at dump, and puts it back at
// restore where CRIU cannot map it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "base/result.h"

namespace cuda_criu {

// Exactly len bytes at addr in pid's memory into buf, or an error naming pid and address.
Status read_process_memory(pid_t pid, uint64_t addr, void *buf, size_t len);
// Exactly len bytes of buf to addr in pid's memory; memory that is not writable there goes through
// /proc/PID/mem (which may write it, as a debugger does).
Status write_process_memory(pid_t pid, uint64_t addr, const void *buf, size_t len);

} // namespace cuda_criu
