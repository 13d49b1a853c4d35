// cuda-criu inspect: what cuda-plugin.img in a CRIU image directory holds, and who holds the GPU state
// (the plugin's GPU image, cuda-gpu*.img, or CRIU's pages images). --verify is in inspect_verify.cpp.
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
#include "commands.h"
#include "inspect.h"
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

// An inherited file's path and flags, and the placeholder the restore opens instead, after what names it.
Json file_json(Json j, const std::string &path, uint32_t flags)
{
	j["path"] = path;
	j["flags"] = flag_names(flags);
	j["restored_as"] = "/dev/null " + flag_names(placeholder_flags(flags));
	return j;
}

Json inherited_json(const InheritedDevicesRecord &r)
{
	Json files = Json::array();
	for (const auto &f : r.files)
		files.push_back(file_json(Json{{"id", f.id}}, f.path, f.flags));
	Json processes = Json::array();
	for (const InheritedProcessRecord &p : r.processes) {
		Json mappings = Json::array();
		for (const auto &m : p.mappings)
			mappings.push_back(Json{{"start", hex(m.start)},
						{"end", hex(m.end)},
						{"perms", m.perms},
						{"offset", m.offset},
						{"path", m.path},
						{"restored_as", mapping_placeholder(m.perms)}});
		Json fds = Json::array();
		for (const auto &f : p.fds)
			fds.push_back(file_json(Json{{"fd", f.fd}}, f.path, f.flags));
		processes.push_back(Json{{"pid", p.pid}, {"ns_pid", p.ns_pid}, {"mappings", mappings}, {"fds", fds}});
	}
	return Json{{"mapped_paths", r.mapped_paths}, {"files", files}, {"processes", processes}};
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

double share(uint64_t part, uint64_t whole)
{
	return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
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
	uint64_t data_bytes = 0;   // written into the image's own files
	uint64_t disk_bytes = 0;   // of the image's own files
	uint64_t parent_bytes = 0; // referenced in a parent image's files (criu dump --prev-images-dir)
	// The image's own compressed chunks (compress=zstd): what they hold, what they take, how many.
	uint64_t packed_bytes = 0, packed_stored = 0;
	size_t packed_chunks = 0;
	// GPU state the image's own files hold (compressed chunks by what they hold).
	uint64_t held_bytes() const { return data_bytes - packed_stored + packed_bytes; }
};

GpuImageView gpu_image_view(int dir_fd, const ImageRecord &r, const GpuImageIndex &idx)
{
	GpuImageView v;
	v.index = &idx;
	for (const GpuDataFile &f : idx.files) {
		GpuFileView fv{f};
		struct stat st;
		if (fstatat(dir_fd, f.path().c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
			fv.present = true;
			fv.disk_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
		}
		if (!f.parent_depth) {
			v.data_bytes += f.data_bytes;
			v.disk_bytes += fv.disk_bytes;
		}
		v.files.push_back(fv);
	}
	v.parent_bytes = idx.parent_bytes();
	for (const GpuProcessChunks &p : idx.processes)
		for (const GpuChunk &c : p.chunks)
			if (c.compressed() && c.file < idx.files.size() && !idx.files[c.file].parent_depth) {
				v.packed_bytes += c.len;
				v.packed_stored += c.stored_len;
				v.packed_chunks++;
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
		std::printf("%-20s %12s %12s %12s\n", printable(f.file.path()).c_str(), mib(f.file.size).c_str(),
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
		    100 * share(v.total.state_bytes - std::min(v.held_bytes(), v.total.state_bytes), v.total.state_bytes),
		    mib(v.disk_bytes).c_str());
	if (v.packed_chunks)
		std::printf("compressed (zstd): %zu chunk(s) holding %s stored in %s, %.2fx; %s of data in all, %.2fx "
			    "(GPU image format 3: a plugin that reads only 1 and 2 refuses it by its version)\n",
			    v.packed_chunks, mib(v.packed_bytes).c_str(), mib(v.packed_stored).c_str(),
			    share(v.packed_bytes, v.packed_stored), mib(v.held_bytes()).c_str(),
			    share(v.held_bytes(), v.data_bytes));
	if (v.parent_bytes)
		std::printf("%s of it unchanged since the parent image (criu dump --prev-images-dir), referenced in its "
			    "files (parent/...), not written again\n",
			    mib(v.parent_bytes).c_str());
	for (const GpuFileView &f : v.files)
		if (!f.present) {
			std::printf("%s is missing: the image cannot be restored (cuda-criu inspect --verify checks every "
				    "file)\n",
				    printable(f.file.path()).c_str());
			break;
		}
}

// The GPU state of a process, or of them all, after what names it.
Json gpu_process_json(Json j, const GpuProcessView &p)
{
	j["state_bytes"] = p.state_bytes;
	j["stored_bytes"] = p.stored_bytes;
	j["zero_bytes"] = p.zero_bytes;
	j["zero_share"] = share(p.zero_bytes, p.state_bytes);
	j["chunks"] = p.chunks;
	return j;
}

Json gpu_image_json(const GpuImageView &v)
{
	const GpuImageIndex &idx = *v.index;
	Json files = Json::array();
	for (const GpuFileView &f : v.files) {
		Json o = {{"name", f.file.path()},
			  {"parent_depth", f.file.parent_depth},
			  {"size", f.file.size},
			  {"data_bytes", f.file.data_bytes},
			  {"present", f.present}};
		o["disk_bytes"] = f.present ? Json(f.disk_bytes) : Json();
		files.push_back(std::move(o));
	}
	Json processes = Json::array();
	for (const GpuProcessView &p : v.processes)
		processes.push_back(gpu_process_json(Json{{"pid", p.pid}, {"ns_pid", p.ns_pid}}, p));
	Json total = gpu_process_json(Json::object(), v.total);
	total["data_bytes"] = v.data_bytes;
	total["disk_bytes"] = v.disk_bytes;
	total["parent_bytes"] = v.parent_bytes;
	total["compressed_chunks"] = v.packed_chunks;
	total["compressed_bytes"] = v.packed_bytes;
	total["compressed_stored_bytes"] = v.packed_stored;
	total["compression_ratio"] = v.data_bytes ? share(v.held_bytes(), v.data_bytes) : 1.0;
	return Json{{"id", idx.id},
		    {"index", kGpuIndexFileName},
		    {"checksum", "CRC-32C"},
		    {"chunk_bytes", idx.chunk_bytes},
		    {"write_us", idx.write_us},
		    {"write_gb_per_s", gb_per_s(v.total.state_bytes, idx.write_us)},
		    {"files", files},
		    {"processes", processes},
		    {"total", total}};
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
	Json j = {{"directory", dir}, {"cuda_image", img.has_value()}};
	// null without cuda-plugin.img: an image of CRIU's own plugin keeps it in the pages
	j["gpu_state_in"] = img ? Json(gpu ? "gpu_image" : "criu_pages") : Json();
	j["gpu_image"] = gpu ? gpu_image_json(*gpu) : Json();
	if (img) {
		const ImageRecord &r = *img;
		j["version"] = r.version;
		j["plugin_version"] = r.plugin_version;
		j["driver_version"] = r.driver_version;
		j["hostname"] = r.hostname;
		j["created_unix"] = r.created_unix;
		j["device_phase_us"] = r.device_phase_us;
		for (const char *key : {"gpus", "other_gpus"}) {
			Json gpus = Json::array();
			for (const GpuRecord &g : key == std::string("gpus") ? r.gpus : r.other_gpus)
				gpus.push_back(Json{{"ordinal", g.ordinal},
						    {"uuid", g.uuid.str()},
						    {"name", g.name},
						    {"memory_bytes", g.memory_bytes},
						    {"pci_bus_id", g.pci_bus_id}});
			j[key] = gpus;
		}
		Json processes = Json::array();
		for (const ProcessRecord &p : r.processes) {
			Json uuids = Json::array();
			for (const auto &u : p.gpu_uuids)
				uuids.push_back(u.str());
			processes.push_back(Json{{"pid", p.pid},
						 {"ns_pid", p.ns_pid},
						 {"initial_state", p.initial_state ? to_string(*p.initial_state) : ""},
						 {"state_bytes", p.state_bytes},
						 {"lock_us", p.lock_us},
						 {"checkpoint_us", p.checkpoint_us},
						 {"gpu_uuids", uuids}});
		}
		j["processes"] = processes;
	}
	if (inherited) // absent when no process held an NVIDIA device file it inherited
		j["inherited_devices"] = inherited_json(*inherited);
	std::fputs(json_text(j).c_str(), stdout);
}


} // namespace

int cmd_inspect(const Invocation &in)
{
	const ParsedArgs &a = in.args;
	if (a.positionals.size() != 1)
		return usage_error("inspect", "takes one image directory");
	const std::string &dir = a.positionals[0];

	UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	if (!fd.valid())
		return report_failure(format("cannot open image directory %s: %s", dir.c_str(), errno_string(errno).c_str()));
	if (a.has("--verify"))
		return inspect_verify(dir, fd.get(), a.has("--json"));
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
