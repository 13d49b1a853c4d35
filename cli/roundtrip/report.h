// What the round trip reports: each step as a row of a table while it runs, a summary at the end, and
// the whole run as JSON and as JUnit XML for CI systems.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "roundtrip/logs.h"

namespace cuda_criu::cli::roundtrip {

enum class StepStatus { Ok, Failed, Skipped };

struct Step {
	unsigned cycle = 0; // 0: before the first dump (setup, start)
	std::string name;
	StepStatus status = StepStatus::Skipped;
	double seconds = 0;
	std::string detail; // what was seen (ok), or what went wrong (failed)
	std::string hint;
	std::vector<LogBlock> logs; // the lines that explain a failure
	// dump only; -1: not known
	int64_t image_bytes = -1;
	int64_t gpu_state_bytes = -1;
	int cuda_processes = -1;
};

// What the reports say of the run besides its steps.
struct RunInfo {
	std::string name;
	std::vector<std::string> command;
	pid_t pid = 0;
	std::string criu;
	std::string criu_version;
	std::string libdir;
	std::vector<std::string> criu_args;
	std::string work_dir;
	bool images_kept = false;
	unsigned long repeat = 1;
	bool leave_running = false;
	std::optional<std::string> device_map;
	std::time_t started_unix = 0;
	double seconds = 0;
	int signal = 0; // the signal that stopped the run, 0 for none
};

// The first failed step, nullptr when none failed.
const Step *failed_step(const std::vector<Step> &steps);

// The command as a shell would take it back, for messages.
std::string shell_join(const std::vector<std::string> &argv);

// The table: its heading, and a row (with hint and log lines) for a step that has ended.
void print_heading(const std::string &name, const std::vector<std::string> &command);
void print_step(const Step &s);
// PASS or FAIL/ERROR with the failed step, times of the dumps and restores, and the work directory.
void print_summary(const RunInfo &run, const std::vector<Step> &steps);

// status: the exit status of the run.
std::string json_report(const RunInfo &run, const std::vector<Step> &steps, int status);
std::string junit_report(const RunInfo &run, const std::vector<Step> &steps);

// Writes text to path; false, with a message naming option, when it cannot.
bool write_report(const std::string &path, const std::string &text, const char *option);

} // namespace cuda_criu::cli::roundtrip
