// cuda-criu inspect: what cuda-plugin.img in a CRIU image directory holds, and who holds the GPU state
// (the plugin's GPU image, cuda-gpu*.img, or CRIU's pages images); with --verify, whether every file a
// restore needs is present and whole.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/text.h"
#include "cli.h"
#include "core/gpu_store.h"
#include "image/criu_pages.h"
#include "image/devices_image.h"
#include "image/gpu_image.h"
#include "image/image.h"
#include "image/image_file.h"
#include "json.h"
#include "os/host.h"
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

// ---- The GPU state: who holds it, and the plugin's GPU image as inspect shows it.

// Who holds the GPU state, what a restore needs, and the dump option that chose it.
constexpr const char *kStateInGpuImage =
	"the plugin's GPU image (cuda-gpu*.img): restore needs this project's cuda_plugin.so\n"
	"  (criu restore -L its directory); CRIU's own CUDA plugin, or none, refuses the image.\n"
	"  Dumped with gpu-image=plugin, the default; gpu-image=criu (CUDA_CRIU_GPU_IMAGE=criu) leaves the\n"
	"  GPU state in CRIU's pages images";
constexpr const char *kStateInCriuPages =
	"CRIU's pages images (pages-*.img): CRIU's own CUDA plugin can restore it too\n"
	"  (dumped with gpu-image=criu, by a CRIU without criu-patches/0004, or to a page server); the plugin's\n"
	"  restore checks it against the checksums in cuda-gpu.img, where the dump recorded them";

uint64_t range_bytes(const std::vector<MemoryRange> &ranges)
{
	uint64_t n = 0;
	for (const MemoryRange &r : ranges)
		n += r.end - r.start;
	return n;
}

double share(uint64_t part, uint64_t whole)
{
	return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

double gb_per_s(uint64_t bytes, uint64_t us)
{
	return static_cast<double>(bytes) / 1e3 / static_cast<double>(std::max<uint64_t>(us, 1));
}

struct GpuFileView {
	GpuDataFile file;        // as the index records it
	bool present = false;    // a regular file of that name is in the directory
	uint64_t disk_bytes = 0; // the blocks it has (its zero pages are holes)
};

struct GpuProcessView {
	int pid = 0;
	int ns_pid = 0;
	uint64_t state_bytes = 0;  // its checkpoint ranges (cuda-plugin.img)
	uint64_t stored_bytes = 0; // its chunks
	uint64_t zero_bytes = 0;   // in all-zero chunks, not stored
	size_t chunks = 0;
};

struct GpuImageView {
	const GpuImageIndex *index = nullptr;
	std::vector<GpuFileView> files;
	std::vector<GpuProcessView> processes;
	GpuProcessView total;
	uint64_t data_bytes = 0; // written into the files
	uint64_t disk_bytes = 0;
};

GpuImageView gpu_image_view(int dir_fd, const ImageRecord &r, const GpuImageIndex &idx)
{
	GpuImageView v;
	v.index = &idx;
	for (const GpuDataFile &f : idx.files) {
		GpuFileView fv{f};
		struct stat st;
		if (fstatat(dir_fd, f.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
			fv.present = true;
			fv.disk_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
		}
		v.data_bytes += f.data_bytes;
		v.disk_bytes += fv.disk_bytes;
		v.files.push_back(fv);
	}
	for (const GpuProcessChunks &p : idx.processes) {
		GpuProcessView pv{p.pid, p.ns_pid, 0, p.stored_bytes(), p.zero_bytes, p.chunks.size()};
		pv.state_bytes = pv.stored_bytes + pv.zero_bytes;
		for (const ProcessRecord &rp : r.processes)
			if (rp.ns_pid == p.ns_pid && !rp.checkpoint_ranges.empty())
				pv.state_bytes = range_bytes(rp.checkpoint_ranges);
		v.total.state_bytes += pv.state_bytes;
		v.total.stored_bytes += pv.stored_bytes;
		v.total.zero_bytes += pv.zero_bytes;
		v.total.chunks += pv.chunks;
		v.processes.push_back(pv);
	}
	return v;
}

void print_gpu_image_text(const GpuImageView &v)
{
	const GpuImageIndex &idx = *v.index;
	std::string chunk = idx.chunk_bytes % (1 << 20) ? format("%u KiB", idx.chunk_bytes >> 10)
							: format("%u MiB", idx.chunk_bytes >> 20);
	std::printf("GPU image %s: %zu data file(s), CRC-32C per %s chunk; written in %.3f s, %.2f GB/s of GPU state\n",
		    printable(idx.id).c_str(), idx.files.size(), chunk.c_str(), idx.write_us / 1e6,
		    gb_per_s(v.total.state_bytes, idx.write_us));
	std::printf("%-20s %12s %12s %12s\n", "FILE", "SIZE", "WRITTEN", "ON-DISK");
	for (const GpuFileView &f : v.files)
		std::printf("%-20s %12s %12s %12s\n", printable(f.file.name).c_str(), mib(f.file.size).c_str(),
			    mib(f.file.data_bytes).c_str(), f.present ? mib(f.disk_bytes).c_str() : "missing");
	std::printf("%-8s %-8s %12s %12s %7s %7s\n", "PID", "NS-PID", "GPU-STATE", "STORED", "ZERO", "CHUNKS");
	auto row = [](const std::string &pid, const std::string &ns_pid, const GpuProcessView &p) {
		std::printf("%-8s %-8s %12s %12s %6.1f%% %7zu\n", pid.c_str(), ns_pid.c_str(), mib(p.state_bytes).c_str(),
			    mib(p.stored_bytes).c_str(), 100 * share(p.zero_bytes, p.state_bytes), p.chunks);
	};
	for (const GpuProcessView &p : v.processes)
		row(std::to_string(p.pid), std::to_string(p.ns_pid), p);
	row("total", "", v.total);
	std::printf("%s of GPU state: %.1f%% in all-zero chunks (not stored), %s written (%.1f%% zero pages), %s on "
		    "disk\n",
		    mib(v.total.state_bytes).c_str(), 100 * share(v.total.zero_bytes, v.total.state_bytes),
		    mib(v.data_bytes).c_str(),
		    100 * share(v.total.state_bytes - std::min(v.data_bytes, v.total.state_bytes), v.total.state_bytes),
		    mib(v.disk_bytes).c_str());
	for (const GpuFileView &f : v.files)
		if (!f.present) {
			std::printf("%s is missing: the image cannot be restored (cuda-criu inspect --verify checks every "
				    "file)\n",
				    printable(f.file.name).c_str());
			break;
		}
}

JsonWriter &gpu_process_json(JsonWriter &j, const GpuProcessView &p)
{
	return j.field("state_bytes", p.state_bytes)
		.field("stored_bytes", p.stored_bytes)
		.field("zero_bytes", p.zero_bytes)
		.field("zero_share", share(p.zero_bytes, p.state_bytes))
		.field("chunks", static_cast<uint64_t>(p.chunks));
}

void gpu_image_json(JsonWriter &j, const GpuImageView &v)
{
	const GpuImageIndex &idx = *v.index;
	j.key("gpu_image").begin_object();
	j.field("id", idx.id)
		.field("index", kGpuIndexFileName)
		.field("checksum", "CRC-32C")
		.field("chunk_bytes", idx.chunk_bytes)
		.field("write_us", idx.write_us)
		.field("write_gb_per_s", gb_per_s(v.total.state_bytes, idx.write_us));
	j.key("files").begin_array();
	for (const GpuFileView &f : v.files) {
		j.begin_object()
			.field("name", f.file.name)
			.field("size", f.file.size)
			.field("data_bytes", f.file.data_bytes)
			.field("present", f.present);
		if (f.present)
			j.field("disk_bytes", f.disk_bytes);
		else
			j.key("disk_bytes").null();
		j.end_object();
	}
	j.end_array().key("processes").begin_array();
	for (const GpuProcessView &p : v.processes)
		gpu_process_json(j.begin_object().field("pid", p.pid).field("ns_pid", p.ns_pid), p).end_object();
	j.end_array().key("total").begin_object();
	gpu_process_json(j, v.total).field("data_bytes", v.data_bytes).field("disk_bytes", v.disk_bytes).end_object();
	j.end_object();
}

void print_text(const ImageRecord &r, const std::optional<GpuImageView> &gpu)
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
	std::printf("\nGPU state: %s\n", gpu ? kStateInGpuImage : kStateInCriuPages);
	if (gpu)
		print_gpu_image_text(*gpu);
}

void print_json(const std::string &dir, const std::optional<ImageRecord> &img,
		const std::optional<InheritedDevicesRecord> &inherited, const std::optional<GpuImageView> &gpu)
{
	JsonWriter j;
	j.begin_object().field("directory", dir).field("cuda_image", img.has_value());
	j.key("gpu_state_in"); // null without cuda-plugin.img: an image of CRIU's own plugin keeps it in the pages
	if (img)
		j.value(gpu ? "gpu_image" : "criu_pages");
	else
		j.null();
	if (gpu)
		gpu_image_json(j, *gpu);
	else
		j.key("gpu_image").null();
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

// ---- --verify: is every file a restore needs present and whole?

constexpr const char *kInventoryFileName = "inventory.img";
// The start of the GPU image's entry in CRIU's inventory (kGpuImageInventoryName).
constexpr const char *kGpuImageInventoryPrefix = "cuda-gpu-image";

struct VerifyCheck {
	std::string name;
	bool ok = true;
	std::string detail;
};

struct Verification {
	std::vector<VerifyCheck> checks;
	std::optional<bool> gpu_image; // the GPU state is in the plugin's GPU image; unknown without cuda-plugin.img
	uint64_t bytes_read = 0;
	uint64_t elapsed_us = 0;

	void add(const std::string &name, bool ok, std::string detail) { checks.push_back({name, ok, std::move(detail)}); }
	size_t failed() const
	{
		auto bad = std::count_if(checks.begin(), checks.end(), [](const VerifyCheck &c) { return !c.ok; });
		return static_cast<size_t>(bad);
	}
};

uint64_t file_size_at(int dir_fd, const char *name)
{
	struct stat st;
	return fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// cuda-plugin.img parses.
std::optional<ImageRecord> verify_plugin_image(Verification &v, int dir_fd)
{
	auto img = read_image(dir_fd);
	if (!img) {
		v.add(kImageFileName, false, img.error().message());
		return std::nullopt;
	}
	if (!*img) {
		v.add(kImageFileName, true,
		      "absent: no CUDA process was dumped by cuda_plugin.so (CRIU's own CUDA plugin writes none)");
		return std::nullopt;
	}
	const ImageRecord &r = **img;
	v.gpu_image = !r.gpu_image_id.empty();
	v.bytes_read += file_size_at(dir_fd, kImageFileName);
	v.add(kImageFileName, true,
	      format("format %u, %zu CUDA process(es); the GPU state is in %s", r.version, r.processes.size(),
		     *v.gpu_image ? "the plugin's GPU image (cuda-gpu*.img)" : "CRIU's pages images"));
	return **img;
}

// inventory.img parses, and lists the GPU image exactly when cuda-plugin.img names one.
void verify_inventory(Verification &v, int dir_fd, bool plugin_image_read)
{
	auto data = read_image_file(dir_fd, kInventoryFileName, kCriuImageMaxBytes);
	if (!data) {
		v.add(kInventoryFileName, false, data.error().message());
		return;
	}
	if (!*data) {
		v.add(kInventoryFileName, false, "missing: CRIU cannot restore without it");
		return;
	}
	v.bytes_read += (*data)->size();
	auto inv = decode_criu_inventory((*data)->data(), (*data)->size());
	if (!inv) {
		v.add(kInventoryFileName, false, inv.error().message());
		return;
	}
	bool lists_gpu_image = false;
	std::string plugins;
	for (const std::string &p : inv->plugins) {
		lists_gpu_image |= p.starts_with(kGpuImageInventoryPrefix);
		plugins += (plugins.empty() ? "" : ", ") + printable(p.substr(0, p.find(' ')));
	}
	std::string detail = format("CRIU image version %u; a restore needs the plugin(s): %s", inv->img_version,
				    plugins.empty() ? "none" : plugins.c_str());
	if (lists_gpu_image && plugin_image_read && !v.gpu_image.value_or(false)) {
		v.add(kInventoryFileName, false,
		      format("lists the plugin's GPU image, but %s names none: the directory mixes files of two dumps, or "
			     "%s is missing",
			     kImageFileName, kImageFileName));
		return;
	}
	if (v.gpu_image.value_or(false) && !lists_gpu_image)
		detail += " (not the GPU image: a CRIU without plugin inventory entries wrote it)";
	v.add(kInventoryFileName, true, detail);
}

// load_gpu_state's errors speak of a restore ("check the GPU image: restore pid 4242 (pid 7 in the
// image): GPU state at ..."); nothing is restored here.
std::string checksum_failure(const std::string &message, const std::vector<GpuLoadTarget> &targets)
{
	for (const GpuLoadTarget &t : targets) {
		std::string context = format("restore pid %d (pid %d in the image): ", t.pid, t.ns_pid);
		if (size_t at = message.find(context); at != std::string::npos)
			return format("pid %d: %s", t.ns_pid, message.substr(at + context.size()).c_str());
	}
	return message;
}

// cuda-gpu.img is present and of this dump and covers every process; each data file is present, of this
// dump and not cut short; every chunk's CRC-32C matches.
// One process's chunks against the memory its pagemap and pages file hold: "" when all match, else what
// is wrong.
std::string check_criu_held_chunks(Verification &v, int dir_fd, const GpuProcessChunks &p, uint32_t chunk_bytes)
{
	std::string name = format("pagemap-%d.img", p.ns_pid);
	auto files = read_pagemap_files(dir_fd, name, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
	if (!files)
		return format("pid %d: %s", p.ns_pid, files.error().message().c_str());
	UniqueFd pages(openat(dir_fd, files->pages.c_str(), O_RDONLY | O_CLOEXEC));
	if (!pages.valid())
		return format("pid %d: open %s: %s", p.ns_pid, files->pages.c_str(), std::strerror(errno));
	std::vector<uint64_t> buf(chunk_bytes / sizeof(uint64_t));
	for (const GpuChunk &c : p.chunks) {
		if (auto st = read_criu_memory(*files, pages.get(), c.addr, buf.data(), c.len); !st)
			return format("pid %d: %s", p.ns_pid, st.error().message().c_str());
		v.bytes_read += c.len;
		if (uint32_t crc = crc32c(buf.data(), c.len); crc != c.crc)
			return format("pid %d: GPU state at %#" PRIx64 " (%u bytes) in %s fails its checksum (CRC-32C %08x, "
				      "recorded %08x): the pages file is damaged",
				      p.ns_pid, c.addr, c.len, files->pages.c_str(), crc, c.crc);
	}
	return "";
}

// The checksums of a GPU state CRIU's pages images hold: present, of this dump, and matching the memory
// the pagemaps and pages files hold (what CRIU will restore).
void verify_gpu_checksums(Verification &v, int dir_fd, const ImageRecord &r)
{
	auto index = read_gpu_index(dir_fd);
	if (!index || !*index) {
		v.add(kGpuIndexFileName, false,
		      index ? format("missing: %s names the checksums of the GPU state in it", kImageFileName)
			    : index.error().message());
		return;
	}
	const GpuImageIndex &idx = **index;
	if (!idx.criu_pages || idx.id != r.gpu_checksums_id) {
		v.add(kGpuIndexFileName, false,
		      format("belongs to another dump (id %s, %s names %s)", printable(idx.id).c_str(), kImageFileName,
			     printable(r.gpu_checksums_id).c_str()));
		return;
	}
	size_t chunks = 0;
	for (const GpuProcessChunks &p : idx.processes)
		chunks += p.chunks.size();
	v.bytes_read += file_size_at(dir_fd, kGpuIndexFileName);
	v.add(kGpuIndexFileName, true,
	      format("CRC-32C of %zu chunk(s) of the GPU state in CRIU's pages images; the restore checks them over "
		     "the memory CRIU restores",
		     chunks));
	std::string bad;
	for (const GpuProcessChunks &p : idx.processes)
		if (bad.empty())
			bad = check_criu_held_chunks(v, dir_fd, p, idx.chunk_bytes);
	v.add("checksums", bad.empty(),
	      bad.empty() ? format("%zu chunk(s) of the GPU state in the pages images match", chunks) : bad);
}

void verify_gpu_image(Verification &v, int dir_fd, const ImageRecord &r)
{
	auto index = read_gpu_index(dir_fd);
	if (!index) {
		v.add(kGpuIndexFileName, false, index.error().message());
		return;
	}
	if (!*index) {
		v.add(kGpuIndexFileName, false,
		      "missing: it indexes this image's GPU state (copy the whole directory, cuda-gpu*.img included)");
		return;
	}
	const GpuImageIndex &idx = **index;
	if (idx.id != r.gpu_image_id) {
		v.add(kGpuIndexFileName, false,
		      format("belongs to another dump (GPU image id %s, %s names %s): the directory mixes files of two "
			     "dumps",
			     printable(idx.id).c_str(), kImageFileName, printable(r.gpu_image_id).c_str()));
		return;
	}
	v.bytes_read += file_size_at(dir_fd, kGpuIndexFileName);
	std::string problem;
	for (const ProcessRecord &p : r.processes) {
		uint64_t want = range_bytes(p.checkpoint_ranges);
		const GpuProcessChunks *c = idx.find(p.ns_pid);
		uint64_t have = c ? c->stored_bytes() + c->zero_bytes : 0;
		if (want && !c)
			problem = format("has no chunks of pid %d, whose %s of GPU state %s records", p.ns_pid,
					 mib(want).c_str(), kImageFileName);
		else if (c && have != want)
			problem = format("covers %" PRIu64 " bytes of pid %d's GPU state, %s records %" PRIu64, have, p.ns_pid,
					 kImageFileName, want);
		if (!problem.empty())
			break;
	}
	size_t chunks = 0;
	for (const GpuProcessChunks &p : idx.processes)
		chunks += p.chunks.size();
	v.add(kGpuIndexFileName, problem.empty(),
	      problem.empty() ? format("of this dump; %zu data file(s), %zu process(es), %zu chunk(s)", idx.files.size(),
				       idx.processes.size(), chunks)
			      : problem);

	// The chunks of the files that open are checked even when another file is missing or cut short:
	// one damaged file is then all there is to copy again.
	GpuImageIndex usable = idx;
	usable.files.clear();
	std::vector<int> renumber(idx.files.size(), -1);
	for (size_t i = 0; i < idx.files.size(); i++) {
		const GpuDataFile &f = idx.files[i];
		auto reader = GpuDataReader::open(dir_fd, f, idx.id);
		if (!reader) {
			v.add(f.name, false, reader.error().message());
			continue;
		}
		v.add(f.name, true,
		      format("of this dump, whole: %" PRIu64 " bytes, %s written", f.size, mib(f.data_bytes).c_str()));
		renumber[i] = static_cast<int>(usable.files.size());
		usable.files.push_back(f);
	}
	uint64_t bytes = 0;
	size_t checked = 0, skipped = 0;
	std::vector<GpuLoadTarget> targets;
	for (GpuProcessChunks &p : usable.processes) {
		size_t all = p.chunks.size();
		std::erase_if(p.chunks, [&](GpuChunk &c) {
			if (renumber[c.file] < 0)
				return true;
			c.file = static_cast<uint32_t>(renumber[c.file]);
			return false;
		});
		skipped += all - p.chunks.size();
		checked += p.chunks.size();
		bytes += p.stored_bytes();
		targets.push_back({p.pid, p.ns_pid, false}); // write=false: checked only; the host is never used
	}
	unsigned threads = gpu_io_threads(0, bytes);
	SystemHost host;
	Status st = load_gpu_state(host, dir_fd, usable, targets, threads);
	v.bytes_read += bytes;
	std::string not_checked = skipped ? format("; %zu chunk(s) in the files above not checked", skipped) : "";
	if (!checked && skipped)
		v.add("checksums", false, format("not checked: all %zu chunk(s) are in the files above", skipped));
	else if (!st)
		v.add("checksums", false, checksum_failure(st.error().message(), targets) + not_checked);
	else
		v.add("checksums", true,
		      format("CRC-32C of %zu chunk(s), %s, read by %u thread(s): every one matches%s", checked,
			     mib(bytes).c_str(), threads, not_checked.c_str()));
}

// Each pagemap's pages file holds at least the bytes of its present entries (the check a restore makes
// with the plugin, shown in detail).
void verify_pages(Verification &v, int dir_fd)
{
	auto names = pagemap_names(dir_fd);
	if (!names) {
		v.add("pagemap-*.img", false, names.error().message());
		return;
	}
	if (names->empty()) {
		v.add("pagemap-*.img", false,
		      "none: the processes' memory is not in this directory (a dump to a page server leaves it there)");
		return;
	}
	const auto page_size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
	for (const std::string &name : *names) {
		auto f = read_pagemap_files(dir_fd, name, page_size);
		if (!f) {
			v.add(name, false, f.error().message());
			continue;
		}
		v.bytes_read += f->pagemap_bytes;
		const CriuPagemap &pm = f->map;
		const char *pages = f->pages.c_str();
		if (f->pages_errno) {
			v.add(name, false,
			      format("%s: %s (it holds the %" PRIu64 " bytes of memory this pagemap declares)", pages,
				     errno_string(f->pages_errno).c_str(), pm.present_bytes));
			continue;
		}
		if (!f->pages_regular) {
			v.add(name, false, format("%s is not a regular file", pages));
			continue;
		}
		if (const PagemapRun *run = f->first_run_cut_off()) {
			v.add(name, false,
			      format("%s is cut short: %" PRIu64 " bytes, its entries declare %" PRIu64 "; the pages of %#" PRIx64
				     " (the entry at offset %" PRIu64 " of %s) lie at offset %" PRIu64 "-%" PRIu64 " of %s",
				     pages, f->pages_size, pm.present_bytes, run->vaddr, run->entry_offset, name.c_str(),
				     run->pages_offset, run->pages_offset + run->bytes, pages));
			continue;
		}
		std::string detail = format("%s holds the %" PRIu64 " bytes (%s) its %zu entries declare", pages,
					    pm.present_bytes, mib(pm.present_bytes).c_str(), pm.entries);
		if (pm.parent_bytes)
			detail += format("; %" PRIu64 " bytes in the parent image (not checked)", pm.parent_bytes);
		if (pm.lazy_bytes)
			detail += format("; %" PRIu64 " bytes served by lazy migration (in no image)", pm.lazy_bytes);
		v.add(name, true, detail);
	}
}

Verification verify_image(int dir_fd)
{
	uint64_t t0 = now_us();
	Verification v;
	auto img = verify_plugin_image(v, dir_fd);
	verify_inventory(v, dir_fd, v.checks.back().ok);
	if (img && v.gpu_image.value_or(false))
		verify_gpu_image(v, dir_fd, *img);
	else if (img && !img->gpu_checksums_id.empty())
		verify_gpu_checksums(v, dir_fd, *img);
	verify_pages(v, dir_fd);
	v.elapsed_us = now_us() - t0;
	return v;
}

std::string checksum_note(const Verification &v)
{
	std::string s = "CRIU keeps no checksum of the processes' ordinary memory: its pages-*.img files are checked "
			"for their size only, not their contents; ";
	if (!v.gpu_image.has_value())
		return s + "only a GPU state that the plugin's GPU image holds is checksummed";
	if (*v.gpu_image)
		return s + "only the GPU state (cuda-gpu-*.img) is checksummed, CRC-32C per chunk";
	return s + "the GPU state is in them too (gpu-image=criu): its checksums (cuda-gpu.img) are checked here "
		   "and by the restore";
}

int print_verification(const std::string &dir, const Verification &v, bool json)
{
	double secs = static_cast<double>(v.elapsed_us) / 1e6;
	double rate = gb_per_s(v.bytes_read, v.elapsed_us);
	size_t failed = v.failed();
	if (json) {
		JsonWriter j;
		j.begin_object().field("directory", dir).field("result", failed ? "fail" : "ok");
		j.key("gpu_state_in");
		if (v.gpu_image)
			j.value(*v.gpu_image ? "gpu_image" : "criu_pages");
		else
			j.null();
		j.key("checks").begin_array();
		for (const VerifyCheck &c : v.checks)
			j.begin_object()
				.field("name", c.name)
				.field("status", c.ok ? "ok" : "fail")
				.field("detail", c.detail)
				.end_object();
		j.end_array()
			.field("bytes_read", v.bytes_read)
			.field("seconds", secs)
			.field("gb_per_s", rate)
			.field("checksums", checksum_note(v))
			.end_object();
		std::fputs(j.str().c_str(), stdout);
	} else {
		for (const VerifyCheck &c : v.checks)
			std::printf("%-4s  %-20s  %s\n", c.ok ? "ok" : "FAIL", printable(c.name).c_str(),
				    printable(c.detail).c_str());
		if (failed)
			std::printf("result: FAIL, %zu check(s) failed: the image cannot be restored as it is; copy it "
				    "again from an intact source",
				    failed);
		else
			std::printf("result: ok, every file a restore needs is present and whole");
		std::printf(" (read %s in %.3f s, %.2f GB/s)\n", mib(v.bytes_read).c_str(), secs, rate);
		std::printf("note: %s\n", checksum_note(v).c_str());
	}
	return failed ? kExitFailure : kExitOk;
}

} // namespace

int cmd_inspect(const Args &args)
{
	ParsedArgs a;
	if (auto rc = parse_command("inspect", args, {{"--json", false, nullptr}, {"--verify", false, nullptr}}, a))
		return *rc;
	if (a.positionals.size() != 1)
		return usage_error("inspect", "takes one image directory");
	const std::string &dir = a.positionals[0];

	UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	if (!fd.valid())
		return report_failure(format("cannot open image directory %s: %s", dir.c_str(), errno_string(errno).c_str()));
	if (a.has("--verify"))
		return print_verification(dir, verify_image(fd.get()), a.has("--json"));
	auto img = read_image(fd.get());
	if (!img)
		return report_failure(format("%s: %s", dir.c_str(), img.error().message().c_str()));
	auto inherited = read_devices_image(fd.get());
	if (!inherited)
		return report_failure(format("%s: %s", dir.c_str(), inherited.error().message().c_str()));
	std::optional<GpuImageIndex> index;
	std::optional<GpuImageView> gpu;
	if (*img && !(**img).gpu_image_id.empty()) {
		auto idx = read_gpu_index(fd.get());
		if (!idx)
			return report_failure(format("%s: %s", dir.c_str(), idx.error().message().c_str()));
		if (!*idx)
			return report_failure(format("%s: %s is missing, and the GPU state of this image is in the plugin's "
						     "GPU image: the image cannot be restored (copy the whole directory; "
						     "cuda-criu inspect --verify checks every file)",
						     dir.c_str(), kGpuIndexFileName));
		if ((*idx)->id != (**img).gpu_image_id)
			return report_failure(format("%s: %s belongs to another dump (GPU image id %s, %s names %s): the "
						     "directory mixes files of two dumps",
						     dir.c_str(), kGpuIndexFileName, printable((*idx)->id).c_str(),
						     kImageFileName, printable((**img).gpu_image_id).c_str()));
		index = std::move(**idx);
		gpu = gpu_image_view(fd.get(), **img, *index);
	}
	if (a.has("--json")) {
		print_json(dir, *img, *inherited, gpu);
		return kExitOk;
	}
	if (!img->has_value())
		std::printf("%s has no %s: no CUDA process was dumped by cuda_plugin.so (an image of CRIU's own CUDA "
			    "plugin, or of processes without CUDA)\n",
			    dir.c_str(), kImageFileName);
	else
		print_text(**img, gpu);
	if (*inherited)
		print_inherited_text(**inherited);
	return kExitOk;
}

} // namespace cuda_criu::cli
