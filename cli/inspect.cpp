// cuda-criu inspect: what cuda-plugin.img in a CRIU image directory holds.
#include <fcntl.h>

#include <cstdio>
#include <ctime>

#include "base/text.h"
#include "cli.h"
#include "image/devices_image.h"
#include "image/image.h"
#include "json.h"
#include "os/unique_fd.h"
#include "units.h"

namespace cuda_criu::cli {
namespace {

std::string utc_time(uint64_t unix_seconds)
{
	if (unix_seconds == 0)
		return "unknown";
	time_t t = static_cast<time_t>(unix_seconds);
	struct tm tm;
	char buf[64];
	if (!gmtime_r(&t, &tm) || !std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm))
		return "unknown";
	return buf;
}

// Open-file status flags as names ("O_RDWR|O_NONBLOCK|O_CLOEXEC").
std::string flag_names(uint32_t flags)
{
	int acc = static_cast<int>(flags) & O_ACCMODE;
	std::string s = acc == O_RDONLY ? "O_RDONLY" : acc == O_WRONLY ? "O_WRONLY" : "O_RDWR";
	if (flags & O_NONBLOCK)
		s += "|O_NONBLOCK";
	if (flags & O_APPEND)
		s += "|O_APPEND";
	if (flags & O_CLOEXEC)
		s += "|O_CLOEXEC";
	return s;
}

// What the restore puts in place of each (core/inherited_devices.h): the same flags the plugin opens
// /dev/null with, close-on-exec kept by CRIU.
uint32_t placeholder_flags(uint32_t flags) { return flags & (O_ACCMODE | O_NONBLOCK | O_APPEND | O_CLOEXEC); }
std::string mapping_placeholder(const std::string &perms)
{
	bool shared = perms.size() >= 4 && perms[3] == 's';
	return std::string("zero-filled ") + (shared ? "shared" : "private") + " memory (/dev/zero)";
}

void print_inherited_text(const InheritedDevicesRecord &r)
{
	std::printf("\nNVIDIA device files inherited by processes forked after CUDA started (%s), restored as "
		    "placeholders:\n",
		    kDevicesImageFileName);
	if (r.processes.empty()) { // written by a plugin that did not record processes
		for (const auto &p : r.mapped_paths)
			std::printf("  mapped %s -> zero-filled memory (/dev/zero)\n", printable(p).c_str());
		for (const auto &f : r.files)
			std::printf("  file id %#x %s %s -> /dev/null %s\n", f.id, printable(f.path).c_str(),
				    flag_names(f.flags).c_str(), flag_names(placeholder_flags(f.flags)).c_str());
		return;
	}
	for (const InheritedProcessRecord &p : r.processes) {
		std::printf("pid %d (ns pid %d): %zu mapping(s), %zu open file(s)\n", p.pid, p.ns_pid, p.mappings.size(),
			    p.fds.size());
		for (const auto &m : p.mappings)
			std::printf("  map %llx-%llx %s offset %#llx %s -> %s\n", static_cast<unsigned long long>(m.start),
				    static_cast<unsigned long long>(m.end), printable(m.perms).c_str(),
				    static_cast<unsigned long long>(m.offset), printable(m.path).c_str(),
				    mapping_placeholder(m.perms).c_str());
		for (const auto &f : p.fds)
			std::printf("  fd %d %s %s -> /dev/null %s\n", f.fd, printable(f.path).c_str(),
				    flag_names(f.flags).c_str(), flag_names(placeholder_flags(f.flags)).c_str());
	}
}

std::string hex(uint64_t v)
{
	char buf[32];
	std::snprintf(buf, sizeof(buf), "%#llx", static_cast<unsigned long long>(v));
	return buf;
}

// An inherited file's path and flags, and the placeholder the restore opens instead.
JsonWriter &file_json(JsonWriter &j, const std::string &path, uint32_t flags)
{
	return j.field("path", path)
		.field("flags", flag_names(flags))
		.field("restored_as", "/dev/null " + flag_names(placeholder_flags(flags)));
}

void inherited_json(JsonWriter &j, const InheritedDevicesRecord &r)
{
	j.key("inherited_devices").begin_object();
	j.key("mapped_paths").begin_array();
	for (const auto &p : r.mapped_paths)
		j.value(p);
	j.end_array().key("files").begin_array();
	for (const auto &f : r.files)
		file_json(j.begin_object().field("id", f.id), f.path, f.flags).end_object();
	j.end_array().key("processes").begin_array();
	for (const InheritedProcessRecord &p : r.processes) {
		j.begin_object().field("pid", p.pid).field("ns_pid", p.ns_pid).key("mappings").begin_array();
		for (const auto &m : p.mappings)
			j.begin_object()
				.field("start", hex(m.start))
				.field("end", hex(m.end))
				.field("perms", m.perms)
				.field("offset", m.offset)
				.field("path", m.path)
				.field("restored_as", mapping_placeholder(m.perms))
				.end_object();
		j.end_array().key("fds").begin_array();
		for (const auto &f : p.fds)
			file_json(j.begin_object().field("fd", f.fd), f.path, f.flags).end_object();
		j.end_array().end_object();
	}
	j.end_array().end_object();
}

void print_text(const ImageRecord &r)
{
	uint64_t total = 0;
	for (const ProcessRecord &p : r.processes)
		total += p.state_bytes;
	// The image's text is untrusted: escaped, so that it cannot send escape sequences to the terminal.
	std::printf("image format %u, plugin %s, NVIDIA driver %s, host %s\n", r.version, printable(r.plugin_version).c_str(),
		    printable(r.driver_version).c_str(), printable(r.hostname).c_str());
	std::printf("written %s; checkpoint phase %.3f s (all processes)\n", utc_time(r.created_unix).c_str(),
		    r.device_phase_us / 1e6);
	std::printf("%zu CUDA process(es), %s of GPU state in all\n", r.processes.size(), mib(total).c_str());
	for (const GpuRecord &g : r.gpus)
		std::printf("GPU %d: %s %s, %.1f GiB, %s\n", g.ordinal, g.uuid.str().c_str(), printable(g.name).c_str(),
			    g.memory_bytes / double(1ULL << 30), printable(g.pci_bus_id).c_str());
	for (const GpuRecord &g : r.other_gpus)
		std::printf("GPU %d: %s %s, %s (no process held it)\n", g.ordinal, g.uuid.str().c_str(),
			    printable(g.name).c_str(), printable(g.pci_bus_id).c_str());
	std::printf("%-8s %-8s %-13s %12s %10s %12s  %s\n", "PID", "NS-PID", "FOUND", "GPU-STATE", "LOCK", "CHECKPOINT",
		    "GPUS");
	for (const ProcessRecord &p : r.processes) {
		std::string gpus;
		for (const auto &u : p.gpu_uuids)
			gpus += (gpus.empty() ? "" : ",") + u.str();
		std::printf("%-8d %-8d %-13s %8.1f MiB %7.1f ms %10.3f s  %s\n", p.pid, p.ns_pid,
			    p.initial_state ? to_string(*p.initial_state) : "unknown",
			    p.state_bytes / double(1 << 20), p.lock_us / 1e3, p.checkpoint_us / 1e6, gpus.c_str());
	}
}

void print_json(const std::string &dir, const std::optional<ImageRecord> &img,
		const std::optional<InheritedDevicesRecord> &inherited)
{
	JsonWriter j;
	j.begin_object().field("directory", dir).field("cuda_image", img.has_value());
	if (img) {
		const ImageRecord &r = *img;
		j.field("version", r.version)
			.field("plugin_version", r.plugin_version)
			.field("driver_version", r.driver_version)
			.field("hostname", r.hostname)
			.field("created_unix", r.created_unix)
			.field("device_phase_us", r.device_phase_us);
		for (const char *key : {"gpus", "other_gpus"}) {
			j.key(key).begin_array();
			for (const GpuRecord &g : key == std::string("gpus") ? r.gpus : r.other_gpus)
				j.begin_object()
					.field("ordinal", g.ordinal)
					.field("uuid", g.uuid.str())
					.field("name", g.name)
					.field("memory_bytes", g.memory_bytes)
					.field("pci_bus_id", g.pci_bus_id)
					.end_object();
			j.end_array();
		}
		j.key("processes").begin_array();
		for (const ProcessRecord &p : r.processes) {
			j.begin_object()
				.field("pid", p.pid)
				.field("ns_pid", p.ns_pid)
				.field("initial_state", p.initial_state ? to_string(*p.initial_state) : "")
				.field("state_bytes", p.state_bytes)
				.field("lock_us", p.lock_us)
				.field("checkpoint_us", p.checkpoint_us);
			j.key("gpu_uuids").begin_array();
			for (const auto &u : p.gpu_uuids)
				j.value(u.str());
			j.end_array().end_object();
		}
		j.end_array();
	}
	if (inherited) // absent when no process held an NVIDIA device file it inherited
		inherited_json(j, *inherited);
	j.end_object();
	std::fputs(j.str().c_str(), stdout);
}

} // namespace

int cmd_inspect(const Args &args)
{
	ParsedArgs a;
	if (auto rc = parse_command("inspect", args, {{"--json", false, nullptr}}, a))
		return *rc;
	if (a.positionals.size() != 1)
		return usage_error("inspect", "takes one image directory");
	const std::string &dir = a.positionals[0];

	UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	if (!fd.valid())
		return report_failure(format("cannot open image directory %s: %s", dir.c_str(), errno_string(errno).c_str()));
	auto img = read_image(fd.get());
	if (!img)
		return report_failure(format("%s: %s", dir.c_str(), img.error().message().c_str()));
	auto inherited = read_devices_image(fd.get());
	if (!inherited)
		return report_failure(format("%s: %s", dir.c_str(), inherited.error().message().c_str()));
	if (a.has("--json")) {
		print_json(dir, *img, *inherited);
		return kExitOk;
	}
	if (!img->has_value())
		std::printf("%s has no %s: no CUDA process was dumped by cuda_plugin.so (an image of CRIU's own CUDA "
			    "plugin, or of processes without CUDA)\n",
			    dir.c_str(), kImageFileName);
	else
		print_text(**img);
	if (*inherited)
		print_inherited_text(**inherited);
	return kExitOk;
}

} // namespace cuda_criu::cli
