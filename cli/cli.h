// What the commands of cuda-criu share: exit statuses, usage errors, the driver, this program's path.
// The commands themselves are in the command table (commands.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "base/result.h"
#include "driver/driver.h"

namespace cuda_criu::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

using Args = std::vector<std::string>;

// The time a helper program has to answer (criu --version), and the grace a driver call gets past its
// own timeout.
inline constexpr unsigned kGraceMs = 5000;

// The cuda-checkpoint command line, as `cuda-criu compat` and through a link named cuda-checkpoint;
// program names the tool in messages ("cuda-checkpoint").
int cmd_compat(const std::string &program, const Args &args);

// The workload selftest runs under CRIU (an internal command, not in the help).
inline constexpr const char *kSelftestWorkloadCommand = "__selftest-workload";

// Help: the overview for an empty command, else the command's page. false: no such command.
bool print_help(const std::string &command);
// The cuda-checkpoint compatible help text (contains "--action", which CRIU's own plugin looks for).
void print_compat_help(const std::string &program);

// "cuda-criu COMMAND: MESSAGE" and a pointer to the help on stderr; returns kExitUsage.
int usage_error(const std::string &command, const std::string &message);
// "cuda-criu: MESSAGE" on stderr; returns kExitFailure.
int report_failure(const std::string &message);

// The driver, loaded once: libcuda_override if not empty, else the plugin's libcuda option
// (CUDA_CRIU_LIBCUDA or the config file), else libcuda.so.1 through the loader's search path.
Result<Driver *> open_driver(const std::string &libcuda_override = {});

// The absolute path of this program's executable (/proc/self/exe).
Result<std::string> self_executable();

// Whether debug messages of the driver layer go to stderr (-v).
void set_verbose(bool verbose);

} // namespace cuda_criu::cli
