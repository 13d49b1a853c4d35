#include "core/restore_setup.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "base/log.h"
#include "base/text.h"
#include "core/gpu_plan.h"
#include "core/gpu_store.h"
#include "image/criu_pages.h"
#include "image/gpu_image.h"
#include "image/image.h"
#include "os/fs_context.h"

namespace cuda_criu {
namespace {

// A pages file cut short hangs a stock CRIU's restore (its restorer retries the read at the end of the
// file forever) or fails it deep inside: refused here, before CRIU reads any page.
Result<PagesCheck> check_pages_before_restore(int dir_fd)
{
	auto check = check_pages_files(dir_fd, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
	if (!check)
		return std::move(check).error().context("%s", "cannot restore");
	for (const std::string &why : check->unchecked)
		LOG_WARN("pages file not checked (CRIU reads it itself): %s", why.c_str());
	LOG_INFO("pages files: %zu pagemap(s), each pages file holds the %s they declare", check->pagemaps,
		 human_bytes(check->bytes).c_str());
	return check;
}

// Whether another restore decodes this process's state (os/decoded_share.h).
bool joined(const MappedGpuImage &mapped, int ns_pid)
{
	auto it = mapped.shares.find(ns_pid);
	return it != mapped.shares.end() && it->second->joined();
}

bool listed(const CriuRestoreCalls &criu, const char *name)
{
	return !criu.take_from_inventory || criu.take_from_inventory(name);
}

// For an image whose GPU state the plugin stored itself: checks its files now, before CRIU restores
// anything, asks CRIU to map what it can from them, and returns how the restore checks every chunk
// (GpuImageLoad: writes what is not mapped before the driver's restore, checks what is from POST_FORKING
// on).
Result<GpuImageLoad> prepare_gpu_image(const Options &options, Host &host, const CriuRestoreCalls &criu,
				       const ImageRecord &image, const PagesCheck &pages, bool &maps_image)
{
	bool data = !image.gpu_image_id.empty(); // else: checksums of the GPU state CRIU's pages images hold
	const std::string &id = data ? image.gpu_image_id : image.gpu_checksums_id;
	if (data)
		(void)listed(criu, kGpuImageInventoryName); // off the list: CRIU would refuse the restore for it
	int dir = criu.image_dir;
	auto index = read_gpu_index(dir);
	if (!index)
		return std::move(index).error().context("%s", "cannot restore: the GPU image is unusable");
	if (!*index)
		return make_error(ENOENT, "cannot restore: %s is missing from the image directory, which %s names (%s): copy "
					  "the whole directory, cuda-gpu*.img included",
				  kGpuIndexFileName, kImageFileName,
				  data ? "the GPU state is in the plugin's files" : "it holds the checksums of the GPU state");
	auto idx = std::make_shared<GpuImageIndex>(std::move(**index));
	if (idx->id != id || idx->criu_pages == data)
		return make_error(EINVAL, "cannot restore: %s belongs to another dump (GPU image id %s, %s names %s): the "
					  "image directory mixes files of two dumps",
				  kGpuIndexFileName, idx->id.c_str(), kImageFileName, id.c_str());
	auto mapped = std::make_shared<MappedGpuImage>(); // what CRIU maps
	if (data) {
		if (auto st = check_gpu_files(dir, *idx); !st)
			return std::move(st).error().context("%s", "cannot restore: the GPU image is incomplete");
		GpuLedgerPlace share_place{options.ledger, options.ledger_timeout_ms};
		*mapped = request_mapped_gpu_image(*idx, options.map_image, criu.map_file, criu.map_fd, &share_place,
						   criu.map_fd_userfault);
		maps_image = !mapped->processes.empty();
		// Decoded state is memory the restore holds until the driver has it (shared memory, not
		// reclaimable): refused now, before CRIU restores anything, where it cannot fit, rather than
		// found out by the kernel's OOM killer halfway.
		uint64_t decoded = 0;
		for (const GpuProcessChunks &p : idx->processes)
			if (mapped->decoded.count(p.ns_pid) && !joined(*mapped, p.ns_pid))
				for (const GpuChunk &c : p.chunks)
					decoded += c.compressed() ? c.len : 0;
		if (auto avail = host.available_memory(); decoded && avail && decoded > *avail)
			return make_error(ENOMEM,
					  "cannot restore: the image's compressed GPU state decodes to %s, which the restore "
					  "holds in memory until the driver has restored it, and the host has %s available: "
					  "free memory, or restore fewer images at once",
					  human_bytes(decoded).c_str(), human_bytes(*avail).c_str());
	}
	const std::set<int> &mapped_processes = mapped->processes;
	uint64_t bytes = 0;
	for (const GpuProcessChunks &p : idx->processes)
		bytes += p.stored_bytes();
	unsigned threads = gpu_io_threads(options.io_threads, bytes);
	Host *h = &host; // outlives the restore session
	// The plugin writes a process's chunks unless CRIU maps them; chunks in a parent's files (an
	// incremental dump) are written always, compressed ones unless decoded into memory CRIU maps
	// (core/mapped_restore.h).
	std::set<int> written_by_plugin;
	for (const GpuProcessChunks &p : idx->processes)
		for (const GpuChunk &c : p.chunks)
			if (data && (idx->files[c.file].parent_depth || (c.compressed() && !mapped->decoded.count(p.ns_pid))))
				written_by_plugin.insert(p.ns_pid); // checksums only: no files
	auto handled_before_restore = [data, mapped_processes, written_by_plugin](pid_t ns_pid) {
		return !data || !mapped_processes.count(ns_pid) || written_by_plugin.count(ns_pid);
	};
	GpuImageLoad load{[idx, dir, h, threads, mapped](const std::vector<GpuLoadTarget> &targets) {
				  std::vector<GpuLoadTarget> t = targets;
				  for (GpuLoadTarget &x : t)
					  x.write = !mapped->processes.count(x.ns_pid);
				  return load_gpu_state(*h, dir, *idx, t, threads);
			  },
			  handled_before_restore, {}, {}, {}, {}};
	// Checked from POST_FORKING on, while CRIU restores memory: what CRIU maps (compressed chunks decoded
	// into the memory it maps from), and the processes with compressed chunks the plugin writes only after
	// CRIU is done: read (and decoded and checked) now, a cold image's reading overlaps CRIU's own instead
	// of following it; the write reads them again from the page cache. No pid yet: only read from the
	// files (the host is never used).
	std::vector<GpuLoadTarget> checked_early;
	for (const GpuProcessChunks &p : idx->processes)
		if (!handled_before_restore(p.ns_pid) ||
		    std::any_of(p.chunks.begin(), p.chunks.end(), [](const GpuChunk &c) { return c.compressed(); }))
			checked_early.push_back({0, p.ns_pid, false});
	// One thread fewer than a restore's readers: CRIU restores memory meanwhile.
	unsigned check_threads = threads > 1 ? threads - 1 : 1;
	// CRIU's own pages files, read first: where both are cold, CRIU's reads (one piece at a time) would
	// otherwise wait behind the GPU image's. Not where they would crowd out the memory CRIU is about to
	// fill from them.
	std::vector<std::string> ahead;
	if (auto avail = host.available_memory(); avail && pages.bytes <= *avail / 4)
		ahead = pages.pages;
	// Before both, the heads of the files the tasks map, which CRIU opens one by one meanwhile
	// (read_heads_ahead); an image without a readable files.img only goes without the hint.
	auto files = criu_reg_files(dir);
	if (!files)
		LOG_DEBUG("no read-ahead of the restored tasks' files: %s", files.error().message().c_str());
	std::vector<CriuRegFile> heads = files ? std::move(*files) : std::vector<CriuRegFile>();
	// Between the two, the pages of those files that the restorer's writes of the tasks' private file
	// mappings fault in (read_ranges_ahead), as much a hint.
	auto cow = cow_file_ranges(dir, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
	if (!cow)
		LOG_DEBUG("no read-ahead of the pages of the restored tasks' files: %s", cow.error().message().c_str());
	std::vector<FileRange> ranges = cow ? std::move(*cow) : std::vector<FileRange>();
	if (!checked_early.empty())
		load.check_mapped = [idx, dir, h, check_threads, checked_early, mapped, ahead, heads,
				     ranges](const std::atomic<bool> &cancel) -> Status {
			uint64_t t0 = now_us();
			ReadAhead h_read = read_heads_ahead(heads, check_threads, &cancel);
			uint64_t t1 = now_us();
			ReadAhead r_read = read_ranges_ahead(ranges, check_threads, &cancel);
			uint64_t t2 = now_us();
			ReadAhead p_read = read_ahead(dir, ahead, check_threads, &cancel);
			LOG_INFO("read ahead for CRIU, before the GPU image: the heads of %zu mapped file(s) (%s in %s), the "
				 "pages of %zu mapped file(s) its tasks wrote (%s in %s) and %zu pages file(s) (%s in %s)",
				 h_read.files, human_bytes(h_read.bytes).c_str(), seconds(t1 - t0).c_str(), r_read.files,
				 human_bytes(r_read.bytes).c_str(), seconds(t2 - t1).c_str(), p_read.files,
				 human_bytes(p_read.bytes).c_str(), seconds(now_us() - t2).c_str());
			std::vector<GpuLoadTarget> t = checked_early;
			for (GpuLoadTarget &x : t)
				if (auto d = mapped->decoded.find(x.ns_pid); d != mapped->decoded.end()) {
					if (Status st = d->second->map(); !st)
						return std::move(st).error().context("process %d of the image", x.ns_pid);
					x.decoded = d->second->data();
					x.skip_compressed = joined(*mapped, x.ns_pid);
				}
			Status st = load_gpu_state(*h, dir, *idx, t, check_threads, &cancel, mapped->lazy.get());
			if (Status served = mapped->lazy->finish(); st && !served)
				st = std::move(served);
			for (auto &[ns_pid, share] : mapped->shares)
				share->tell(static_cast<bool>(st));
			// What another restore decodes: its verdict, else decoded here after all.
			std::vector<GpuLoadTarget> left;
			for (GpuLoadTarget &x : t)
				if (st && x.skip_compressed) {
					DecodedShare &share = *mapped->shares.at(x.ns_pid);
					uint64_t t0 = now_us();
					if (share.wait(cancel)) {
						LOG_INFO("pid %d: its GPU state was decoded by the restore CRIU pid %d runs (waited %s)",
							 x.ns_pid, share.publisher(), seconds(now_us() - t0).c_str());
						continue;
					}
					LOG_INFO("pid %d: the restore CRIU pid %d runs did not decode its GPU state (it failed or "
						 "ended): decoded here",
						 x.ns_pid, share.publisher());
					x.skip_compressed = false;
					left.push_back(x);
				}
			if (st && !left.empty())
				st = load_gpu_state(*h, dir, *idx, left, check_threads, &cancel);
			for (auto &[ns_pid, memory] : mapped->decoded)
				memory->unmap(); // CRIU's mapping of it in the process stays
			return st;
		};
	if (!mapped->decoded.empty()) {
		load.decoded = [mapped](pid_t ns_pid) { return mapped->decoded.count(ns_pid) != 0; };
		if (criu.userfaultfd)
			load.attach_lazy = [mapped, uffd = criu.userfaultfd] { return mapped->lazy->attach(uffd); };
		load.release_decoded = [mapped, h](pid_t ns_pid, pid_t pid) {
			auto d = mapped->decoded.find(ns_pid);
			if (d == mapped->decoded.end())
				return;
			MemFile &memory = *d->second;
			for (const Mapping &m : h->memory_map(pid))
				if (memory.is(m)) {
					LOG_WARN("pid %d still maps its decoded GPU state after the driver restored it (%#" PRIx64
						 "-%#" PRIx64 "): those %s of memory stay in use while it runs",
						 pid, m.start, m.end, human_bytes(memory.bytes()).c_str());
					return;
				}
			// Shared with other restores of the image: only the last one to let go frees it.
			if (auto share = mapped->shares.find(ns_pid); share != mapped->shares.end() && !share->second->leave())
				return;
			// Given back on a thread of its own: freeing gigabytes takes a while (0.5 s for 4 GiB of 4 KiB
			// pages on the GPU machine's kind of VM), which the process need not wait for. Where CRIU exits
			// first (restore -d), its exit frees the memory anyway.
			try {
				own_thread([m = d->second] {
					use_own_fs_context();
					m->free_memory();
				}).detach();
			} catch (const std::system_error &) {
				memory.free_memory();
			}
		};
	}
	return load;
}

// An image without cuda-plugin.img may still hold a GPU index: checksums of a GPU state CRIU's pages
// hold restore unchecked; the plugin's own GPU image cannot restore without the record that names it.
Status check_index_without_image(int dir)
{
	if (faccessat(dir, kGpuIndexFileName, F_OK, AT_SYMLINK_NOFOLLOW) != 0)
		return {};
	auto index = read_gpu_index(dir);
	if (!index || !*index || !(*index)->criu_pages)
		return make_error(ENOENT, "cannot restore: the image directory holds a GPU image (%s) but no %s: copy the "
					  "whole image directory",
				  kGpuIndexFileName, kImageFileName);
	LOG_WARN("%s holds checksums of the GPU state, but there is no %s to name it: the GPU state is restored "
		 "unchecked",
		 kGpuIndexFileName, kImageFileName);
	return {};
}

} // namespace

Result<RestoreSetup> set_up_restore(const Options &options, Host &host, const CriuRestoreCalls &criu)
{
	RestoreSetup setup;
	if (!listed(criu, kPluginName)) {
		LOG_INFO("the image holds no CUDA process; CUDA plugin inactive");
		return setup;
	}
	auto pages = check_pages_before_restore(criu.image_dir);
	if (!pages)
		return std::move(pages).error();
	// Read now: the restored tasks answer from this copy, forked before their fds are rearranged.
	setup.inherited = std::make_unique<InheritedDevicesRestore>(criu.image_dir);
	if (auto st = setup.inherited->load(); !st)
		return std::move(st).error();
	auto image = read_image(criu.image_dir);
	if (!image)
		return std::move(image).error().context("%s", "cannot restore: the CUDA plugin's image is unusable");
	bool driver = host.nvidia_driver_present(options.libcuda);
	if (image->has_value() && !driver)
		return make_error(ENODEV,
				  "the image holds %zu CUDA process(es) (dumped with NVIDIA driver %s) but this machine has "
				  "no NVIDIA driver: restore on a machine with the driver and GPUs",
				  (*image)->processes.size(), (*image)->driver_version.c_str());
	if (!driver) {
		LOG_INFO("no NVIDIA driver on this machine; CUDA plugin inactive");
		return setup;
	}
	if (!image->has_value()) {
		if (auto st = check_index_without_image(criu.image_dir); !st)
			return std::move(st).error();
		setup.active = true;
		return setup;
	}
	const ImageRecord &record = **image;
	if (auto st = check_driver_version(record, host.driver_version()); !st)
		return std::move(st).error().context("%s", "cannot restore");
	// CRIU's pages images hold the GPU state unless the plugin's GPU image does: mapped from there.
	if (record.gpu_image_id.empty())
		setup.maps_image = request_mapped_restore(record, options.map_image, criu.map_from_image) > 0;
	if (!record.gpu_image_id.empty() || !record.gpu_checksums_id.empty()) {
		auto load = prepare_gpu_image(options, host, criu, record, *pages, setup.maps_image);
		if (!load)
			return std::move(load).error();
		setup.load_gpu = std::move(*load);
	}
	setup.image = std::move(*image);
	setup.active = true;
	return setup;
}

std::unique_ptr<RestoreSession> start_restore(const Options &options, Host &host, DriverSource driver,
					      RestoreSetup setup, bool criu_fails_on_error)
{
	auto guard = RestoreGuard::start();
	if (!guard)
		LOG_WARN("no guard for this restore (%s): if CRIU dies mid-restore, a restored CUDA process may run on "
			 "without its GPU state; check with cuda-criu status",
			 guard.error().message().c_str());
	bool with_image = setup.image.has_value();
	auto session = std::make_unique<RestoreSession>(options, host, std::move(driver), std::move(setup.image),
							criu_fails_on_error, guard ? std::move(*guard) : RestoreGuard(),
							std::move(setup.load_gpu));
	LOG_INFO("ready to restore CUDA processes (version %s%s)", CUDA_CRIU_VERSION,
		 with_image ? "" : "; image without cuda-plugin.img");
	return session;
}

// The driver unmaps its copy of the GPU state once restored; a mapping of the image it kept is harmless
// but ties the process to the image's pages file.
void warn_if_image_still_mapped(Host &host, int image_dir, pid_t pid)
{
	std::string dir = host.fd_path(image_dir);
	if (dir.empty())
		return;
	std::string left = image_still_mapped(host.memory_map(pid), dir);
	if (!left.empty())
		LOG_WARN("pid %d still maps the image after its GPU state was restored (%s): keep the image's pages "
			 "files in place while it runs (a later dump of it refers to them, or needs --ghost-limit once "
			 "they are deleted), or restore with CUDA_CRIU_MAP_IMAGE=off",
			 pid, left.c_str());
}

} // namespace cuda_criu
