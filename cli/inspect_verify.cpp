// cuda-criu inspect --verify: is every file a restore of the image needs present and whole? One line per
// check (cuda-plugin.img, the inventory, the GPU image's index, data files and checksums, CRIU's
// pagemaps against their pages files).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/text.h"
#include "cli.h"
#include "core/gpu_store.h"
#include "image/criu_pages.h"
#include "image/gpu_image.h"
#include "image/image.h"
#include "image/image_file.h"
#include "inspect.h"
#include "json.h"
#include "os/host.h"
#include "os/unique_fd.h"
#include "units.h"

namespace cuda_criu::cli {
namespace {

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

// load_gpu_state's errors name a process of the image that has no pid ("check the GPU image: process 7 of
// the image: GPU state at ..."): here "pid 7: GPU state at ...".
std::string checksum_failure(const std::string &message, const std::vector<GpuLoadTarget> &targets)
{
	for (const GpuLoadTarget &t : targets) {
		std::string context = format("process %d of the image: ", t.ns_pid);
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
		targets.push_back({0, p.ns_pid, false}); // no pid: read and checked only; the host is never used
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
		Json checks = Json::array();
		for (const VerifyCheck &c : v.checks)
			checks.push_back(Json{{"name", c.name}, {"status", c.ok ? "ok" : "fail"}, {"detail", c.detail}});
		Json j = {{"directory", dir},
			  {"result", failed ? "fail" : "ok"},
			  {"gpu_state_in", v.gpu_image ? Json(*v.gpu_image ? "gpu_image" : "criu_pages") : Json()},
			  {"checks", checks},
			  {"bytes_read", v.bytes_read},
			  {"seconds", secs},
			  {"gb_per_s", rate},
			  {"checksums", checksum_note(v)}};
		std::fputs(json_text(j).c_str(), stdout);
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

int inspect_verify(const std::string &dir, int dir_fd, bool json)
{
	return print_verification(dir, verify_image(dir_fd), json);
}

} // namespace cuda_criu::cli
