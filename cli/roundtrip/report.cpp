#include "roundtrip/report.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <string_view>

#include "base/format.h"
#include "cli.h"
#include "json.h"

namespace cuda_criu::cli::roundtrip {
namespace {

const char *status_word(StepStatus s) { return s == StepStatus::Ok ? "ok" : s == StepStatus::Failed ? "FAIL" : "skip"; }

std::string step_label(const Step &s) { return s.cycle ? format("cycle %u: %s", s.cycle, s.name.c_str()) : s.name; }

void print_stats(const std::vector<Step> &steps, const char *name)
{
	std::vector<double> t;
	for (const Step &s : steps)
		if (s.name == name && s.status == StepStatus::Ok)
			t.push_back(s.seconds);
	if (t.empty())
		return;
	std::sort(t.begin(), t.end());
	double median = t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
	std::printf("      %-8s median %.2f s, min %.2f s, max %.2f s over %zu cycles\n", name, median, t.front(),
		    t.back(), t.size());
}

const char *result_word(const RunInfo &run, int status)
{
	if (run.signal)
		return "interrupted";
	if (status == kExitOk)
		return "pass";
	return status == kExitFailure ? "fail" : "error";
}

Json json_cycle(unsigned cycle) { return cycle ? Json(cycle) : Json(); }

Json json_step(const Step &s)
{
	Json j = {{"cycle", json_cycle(s.cycle)},
		  {"step", s.name},
		  {"result", s.status == StepStatus::Ok ? "ok" : s.status == StepStatus::Failed ? "fail" : "skipped"},
		  {"seconds", s.seconds},
		  {"detail", s.detail}};
	if (!s.hint.empty())
		j["hint"] = s.hint;
	if (s.image_bytes >= 0)
		j["image_bytes"] = s.image_bytes;
	if (s.gpu_state_bytes >= 0)
		j["gpu_state_bytes"] = s.gpu_state_bytes;
	if (s.cuda_processes >= 0)
		j["cuda_processes"] = s.cuda_processes;
	if (!s.logs.empty()) {
		Json logs = Json::array();
		for (const LogBlock &b : s.logs)
			logs.push_back(Json{{"file", b.file}, {"lines", b.lines}});
		j["log"] = logs;
	}
	return j;
}

std::string xml_escape(std::string_view s, bool attribute)
{
	std::string out;
	for (char c : s) {
		switch (c) {
		case '&':
			out += "&amp;";
			break;
		case '<':
			out += "&lt;";
			break;
		case '>':
			out += "&gt;";
			break;
		case '"':
			out += attribute ? "&quot;" : "\"";
			break;
		case '\n':
			out += attribute ? "&#10;" : "\n";
			break;
		case '\t':
			out += attribute ? "&#9;" : "\t";
			break;
		default:
			// clean_line() left no other control characters; this keeps the document valid anyway.
			out += static_cast<unsigned char>(c) < 0x20 ? '?' : c;
		}
	}
	return out;
}

std::string attr(const std::string &s) { return xml_escape(s, true); }

std::string junit_properties(const RunInfo &run)
{
	std::string x = "  <properties>\n";
	auto property = [&](const char *name, const std::string &value) {
		x += format("    <property name=\"%s\" value=\"%s\"/>\n", name, attr(clean_line(value)).c_str());
	};
	property("command", shell_join(run.command));
	property("criu", run.criu + " " + run.criu_version);
	property("libdir", run.libdir);
	property("repeat", std::to_string(run.repeat));
	property("leave_running", run.leave_running ? "true" : "false");
	if (run.device_map)
		property("device_map", *run.device_map);
	return x + "  </properties>\n";
}

std::string junit_testcase(const std::string &classname, const Step &s)
{
	std::string x = format("  <testcase classname=\"%s\" name=\"%s\" time=\"%.3f\"", attr(classname).c_str(),
			       attr(step_label(s)).c_str(), s.seconds);
	if (s.status == StepStatus::Ok)
		return x + format(">\n    <system-out>%s</system-out>\n  </testcase>\n", xml_escape(s.detail, false).c_str());
	if (s.status == StepStatus::Skipped)
		return x + ">\n    <skipped message=\"not run: an earlier step failed\"/>\n  </testcase>\n";
	std::string body = s.detail + "\n";
	if (!s.hint.empty())
		body += "hint: " + s.hint + "\n";
	for (const LogBlock &b : s.logs) {
		body += b.file + ":\n";
		for (const std::string &l : b.lines)
			body += "  " + l + "\n";
	}
	return x + format(">\n    <failure message=\"%s\" type=\"%s\">%s</failure>\n  </testcase>\n",
			  attr(s.detail).c_str(), attr(s.name).c_str(), xml_escape(body, false).c_str());
}

} // namespace

const Step *failed_step(const std::vector<Step> &steps)
{
	for (const Step &s : steps)
		if (s.status == StepStatus::Failed)
			return &s;
	return nullptr;
}

std::string shell_join(const std::vector<std::string> &argv)
{
	std::string out;
	for (const std::string &a : argv) {
		if (!out.empty())
			out += ' ';
		bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
							       "-_./=:,+@%") == std::string::npos;
		if (plain) {
			out += a;
			continue;
		}
		out += '\'';
		for (char c : a)
			out += c == '\'' ? std::string("'\\''") : std::string(1, c);
		out += '\'';
	}
	return out;
}

void print_heading(const std::string &name, const std::vector<std::string> &command)
{
	std::printf("cuda-criu roundtrip %s: %s\n", name.c_str(), shell_join(command).c_str());
	std::printf("%5s  %-8s %-6s %10s  %s\n", "CYCLE", "STEP", "RESULT", "TIME", "DETAIL");
	std::fflush(stdout);
}

void print_step(const Step &s)
{
	std::string cycle = s.cycle ? std::to_string(s.cycle) : "-";
	std::printf("%5s  %-8s %-6s %8.2f s  %s\n", cycle.c_str(), s.name.c_str(), status_word(s.status), s.seconds,
		    s.detail.c_str());
	const std::string indent(35, ' '); // under DETAIL
	if (!s.hint.empty())
		std::printf("%shint: %s\n", indent.c_str(), s.hint.c_str());
	for (const LogBlock &b : s.logs) {
		if (b.lines.empty())
			continue;
		std::printf("%s%s:\n", indent.c_str(), b.file.c_str());
		for (const std::string &l : b.lines)
			std::printf("%s  %s\n", indent.c_str(), l.c_str());
	}
	std::fflush(stdout);
}

void print_summary(const RunInfo &run, const std::vector<Step> &steps)
{
	const Step *failed = failed_step(steps);
	if (!failed) {
		std::printf("PASS  roundtrip %s: %lu cycle(s) of dump and restore in %.2f s\n", run.name.c_str(),
			    run.repeat, run.seconds);
		if (run.repeat > 1)
			for (const char *name : {"dump", "restore"})
				print_stats(steps, name);
	} else {
		std::printf("%s  roundtrip %s: %s: %s\n", failed->cycle ? "FAIL" : "ERROR", run.name.c_str(),
			    step_label(*failed).c_str(), failed->detail.c_str());
		if (failed->cycle == 0 && !run.signal)
			std::printf("      the round trip was not tried: nothing was checkpointed\n");
	}
	if (run.images_kept)
		std::printf("work directory kept: %s\n", run.work_dir.c_str());
	else if (failed && failed->cycle > 0)
		std::printf("work directory removed; --keep-images keeps the images and all logs\n");
}

std::string json_report(const RunInfo &run, const std::vector<Step> &steps, int status)
{
	Json json_steps = Json::array();
	for (const Step &s : steps)
		json_steps.push_back(json_step(s));
	Json failure;
	if (const Step *f = failed_step(steps))
		failure = Json{{"cycle", json_cycle(f->cycle)}, {"step", f->name}, {"message", f->detail}, {"hint", f->hint}};
	Json j = {{"name", run.name},
		  {"result", result_word(run, status)},
		  {"exit_status", run.signal ? 128 + run.signal : status},
		  {"command", run.command},
		  {"pid", run.pid},
		  {"criu", Json{{"path", run.criu}, {"version", run.criu_version}}},
		  {"libdir", run.libdir},
		  {"criu_args", run.criu_args},
		  {"work_dir", run.work_dir},
		  {"images_kept", run.images_kept},
		  {"repeat", run.repeat},
		  {"leave_running", run.leave_running},
		  {"device_map", run.device_map ? Json(*run.device_map) : Json()},
		  {"started_unix", run.started_unix},
		  {"seconds", run.seconds},
		  {"steps", json_steps},
		  {"failure", failure}};
	return json_text(j);
}

std::string junit_report(const RunInfo &run, const std::vector<Step> &steps)
{
	size_t failures = 0, skipped = 0;
	for (const Step &s : steps) {
		failures += s.status == StepStatus::Failed;
		skipped += s.status == StepStatus::Skipped;
	}
	char stamp[32] = "";
	struct tm tm = {};
	if (gmtime_r(&run.started_unix, &tm))
		std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	char host[256] = "";
	gethostname(host, sizeof(host) - 1);

	std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
	x += format("<testsuite name=\"%s\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" skipped=\"%zu\" "
		    "time=\"%.3f\" timestamp=\"%s\" hostname=\"%s\">\n",
		    attr("cuda-criu roundtrip " + run.name).c_str(), steps.size(), failures, skipped, run.seconds, stamp,
		    attr(clean_line(host)).c_str());
	x += junit_properties(run);
	// JUnit viewers split a class name at its dots.
	std::string classname = "roundtrip.";
	for (char c : run.name)
		classname += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
	for (const Step &s : steps)
		x += junit_testcase(classname, s);
	return x + "</testsuite>\n";
}

bool write_report(const std::string &path, const std::string &text, const char *option)
{
	std::ofstream f(path, std::ios::binary | std::ios::trunc);
	f << text;
	f.close();
	if (!f) {
		std::printf("error: %s %s: cannot write the file\n", option, path.c_str());
		return false;
	}
	return true;
}

} // namespace cuda_criu::cli::roundtrip
