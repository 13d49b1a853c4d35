// cuda-criu ps and status: the CUDA checkpoint state of processes.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "cli.h"
#include "commands.h"
#include "json.h"
#include "core/dump_refusals.h"
#include "os/host.h"
#include "os/proc.h"
#include "process_errors.h"

namespace cuda_criu::cli {
namespace {

struct ProcessReport {
	pid_t pid = 0;
	std::optional<CudaState> state;
	std::optional<pid_t> restore_tid;
	std::string error;   // why the driver could not answer
	std::string command; // ps only
	std::string refused; // ps only: why a dump of it would be refused before the lock (core/dump_refusals.h)
};

ProcessReport query(Driver &driver, pid_t pid)
{
	ProcessReport r;
	r.pid = pid;
	auto state = driver.state(pid);
	if (!state) {
		r.error = explain_process_error(pid, state.error()).message();
		return r;
	}
	r.state = *state;
	if (auto tid = driver.restore_thread_id(pid))
		r.restore_tid = *tid;
	return r;
}

// The command line with spaces between the arguments, or "[comm]" when it is empty (a zombie).
std::string command_of(pid_t pid)
{
	std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
	std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
	while (!cmd.empty() && cmd.back() == '\0')
		cmd.pop_back();
	for (char &c : cmd)
		if (c == '\0')
			c = ' ';
	if (cmd.empty()) {
		std::ifstream c("/proc/" + std::to_string(pid) + "/comm");
		std::string comm;
		std::getline(c, comm);
		cmd = "[" + comm + "]";
	}
	return cmd;
}

// Every process but this one with libcuda mapped, by pid.
std::vector<pid_t> cuda_processes()
{
	std::vector<pid_t> out;
	std::error_code ec;
	for (const auto &entry : std::filesystem::directory_iterator("/proc", ec)) {
		auto pid = parse_pid(entry.path().filename().string());
		if (pid && *pid != getpid() && maps_libcuda(*pid))
			out.push_back(*pid);
	}
	std::sort(out.begin(), out.end());
	return out;
}

void print_json(const std::vector<ProcessReport> &reports, bool with_command)
{
	Json processes = Json::array();
	for (const ProcessReport &r : reports) {
		Json p = {{"pid", r.pid}};
		p["state"] = r.state ? Json(to_string(*r.state)) : Json();
		p["restore_tid"] = r.restore_tid ? Json(*r.restore_tid) : Json();
		if (with_command) {
			p["command"] = r.command;
			p["checkpoint_refused"] = r.refused.empty() ? Json() : Json(r.refused);
		}
		p["error"] = r.error.empty() ? Json() : Json(r.error);
		processes.push_back(std::move(p));
	}
	std::fputs(json_text(Json{{"processes", processes}}).c_str(), stdout);
}

int list_all(bool json)
{
	std::vector<pid_t> pids = cuda_processes();
	std::vector<ProcessReport> reports;
	if (!pids.empty()) {
		// The driver is needed only when there is something to ask it about.
		auto d = open_driver();
		if (!d)
			return report_failure(d.error().message());
		SystemHost host;
		for (pid_t pid : pids) {
			if (!process_exists(pid))
				continue; // ended since the scan
			reports.push_back(query(**d, pid));
			reports.back().command = command_of(pid);
			if (reports.back().state == CudaState::Running || reports.back().state == CudaState::Locked)
				if (Status st = refuse_sharing(host, pid); !st)
					reports.back().refused = st.error().message();
		}
	}
	if (json) {
		print_json(reports, true);
		return kExitOk;
	}
	std::printf("%-8s %-13s %-12s %s\n", "PID", "STATE", "RESTORE-TID", "COMMAND");
	for (const ProcessReport &r : reports) {
		std::string tid = r.restore_tid ? std::to_string(*r.restore_tid) : "-";
		std::printf("%-8d %-13s %-12s %s\n", r.pid, r.state ? to_string(*r.state) : "-", tid.c_str(),
			    r.command.c_str());
		if (!r.refused.empty())
			std::printf("%-8s cannot be checkpointed: %s\n", "", r.refused.c_str());
	}
	return kExitOk;
}

} // namespace

int cmd_ps(const Invocation &in)
{
	const ParsedArgs &a = in.args;
	if (!a.positionals.empty())
		return usage_error("ps", "takes no arguments (use 'cuda-criu status PID...' for given processes)");
	return list_all(a.has("--json"));
}

int cmd_status(const Invocation &in)
{
	const ParsedArgs &a = in.args;
	if (a.positionals.empty())
		return list_all(a.has("--json"));
	std::vector<pid_t> pids;
	for (const std::string &p : a.positionals) {
		auto pid = parse_pid(p);
		if (!pid)
			return usage_error("status", pid.error().message());
		pids.push_back(*pid);
	}
	auto d = open_driver();
	if (!d)
		return report_failure(d.error().message());
	std::vector<ProcessReport> reports;
	int rc = kExitOk;
	for (pid_t pid : pids) {
		reports.push_back(query(**d, pid));
		if (!reports.back().state)
			rc = kExitFailure;
	}
	if (a.has("--json")) {
		print_json(reports, false);
		return rc;
	}
	for (const ProcessReport &r : reports) {
		if (r.state)
			std::printf("%d %s\n", r.pid, to_string(*r.state));
		else
			std::fprintf(stderr, "cuda-criu: status pid %d: %s\n", r.pid, r.error.c_str());
	}
	return rc;
}

} // namespace cuda_criu::cli
