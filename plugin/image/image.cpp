#include "image/image.h"


#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "base/text.h"
#include "cuda_plugin.pb-c.h"
#include "image/image_file.h"

namespace cuda_criu {
namespace {

constexpr char kMagic[8] = {'C', 'U', 'D', 'A', 'C', 'R', 'I', 'U'};

constexpr RecordFile<ImageRecord> kFile{kImageFileName, kImageMaxBytes, encode_image, decode_image};

std::string str_or_empty(const char *s) { return s ? s : ""; }

// What a machine can have: counts and lengths over these are corruption, refused before they cost.
Status check_limits(const CudaPluginImage &img)
{
	auto string_ok = [](const char *s) { return !s || std::strlen(s) <= kImageMaxStringBytes; };
	if (img.n_processes > kImageMaxProcesses)
		return make_error(EINVAL, "corrupt image: %zu processes (at most %zu)", img.n_processes, kImageMaxProcesses);
	if (img.n_gpus > kImageMaxGpus || img.n_other_gpus > kImageMaxGpus)
		return make_error(EINVAL, "corrupt image: %zu + %zu GPUs (at most %zu each)", img.n_gpus, img.n_other_gpus,
				  kImageMaxGpus);
	if (!string_ok(img.driver_version) || !string_ok(img.plugin_version) || !string_ok(img.hostname) ||
	    !string_ok(img.gpu_image_id) || !string_ok(img.gpu_checksums_id))
		return make_error(EINVAL, "corrupt image: a version or host name longer than %zu bytes", kImageMaxStringBytes);
	for (size_t i = 0; i < img.n_gpus + img.n_other_gpus; i++) {
		const CudaGpu *g = i < img.n_gpus ? img.gpus[i] : img.other_gpus[i - img.n_gpus];
		if (!string_ok(g->uuid) || !string_ok(g->name) || !string_ok(g->pci_bus_id))
			return make_error(EINVAL, "corrupt image: GPU %zu has a text longer than %zu bytes", i,
					  kImageMaxStringBytes);
	}
	for (size_t i = 0; i < img.n_processes; i++) {
		const CudaProcess *p = img.processes[i];
		if (p->n_gpu_uuids > kImageMaxGpus)
			return make_error(EINVAL, "corrupt image: process %zu names %zu GPUs (at most %zu)", i,
					  p->n_gpu_uuids, kImageMaxGpus);
		if (!string_ok(p->initial_state))
			return make_error(EINVAL, "corrupt image: process %zu has a state longer than %zu bytes", i,
					  kImageMaxStringBytes);
	}
	return {};
}

Result<GpuUuid> decode_uuid(const char *text, const char *what, size_t index)
{
	auto u = GpuUuid::parse(str_or_empty(text));
	if (!u)
		return std::move(u).error().context("corrupt image: %s %zu", what, index);
	return u;
}

// A GPU list as messages (`gpus` holds them, `ptrs` points at them, as protobuf-c wants).
void encode_gpus(const std::vector<GpuRecord> &list, PackedStrings &keep, std::vector<CudaGpu> &gpus,
		 std::vector<CudaGpu *> &ptrs)
{
	gpus.resize(list.size());
	for (size_t i = 0; i < list.size(); i++) {
		const GpuRecord &g = list[i];
		CudaGpu &m = gpus[i];
		cuda_gpu__init(&m);
		m.uuid = keep.keep(g.uuid.str());
		m.name = keep.keep(g.name);
		m.has_memory_bytes = true;
		m.memory_bytes = g.memory_bytes;
		m.pci_bus_id = keep.keep(g.pci_bus_id);
		m.has_ordinal = true;
		m.ordinal = g.ordinal;
		ptrs.push_back(&m);
	}
}

// A range list as messages (`ranges` holds them, `ptrs` points at them, as protobuf-c wants); returns how
// many.
struct RangeMessages {
	std::vector<CudaRange> ranges;
	std::vector<CudaRange *> ptrs;
	size_t encode(const std::vector<MemoryRange> &in)
	{
		ranges.resize(in.size());
		for (size_t j = 0; j < in.size(); j++) {
			cuda_range__init(&ranges[j]);
			ranges[j].start = in[j].start;
			ranges[j].end = in[j].end;
			ptrs.push_back(&ranges[j]);
		}
		return ptrs.size();
	}
};

Result<std::vector<MemoryRange>> decode_ranges(CudaRange *const *ranges, size_t n)
{
	std::vector<MemoryRange> out;
	for (size_t j = 0; j < n; j++) {
		if (ranges[j]->start >= ranges[j]->end)
			return make_error(EINVAL, "an empty memory range %#" PRIx64 "-%#" PRIx64, ranges[j]->start,
					  ranges[j]->end);
		out.push_back({ranges[j]->start, ranges[j]->end});
	}
	return out;
}

Result<std::vector<GpuRecord>> decode_gpus(CudaGpu *const *gpus, size_t n)
{
	std::vector<GpuRecord> out;
	for (size_t i = 0; i < n; i++) {
		auto uuid = decode_uuid(gpus[i]->uuid, "GPU", i);
		if (!uuid)
			return std::move(uuid).error();
		out.push_back({*uuid, str_or_empty(gpus[i]->name), gpus[i]->memory_bytes, str_or_empty(gpus[i]->pci_bus_id),
			       gpus[i]->has_ordinal ? gpus[i]->ordinal : -1});
	}
	return out;
}

} // namespace

Status write_image(int dir_fd, const ImageRecord &record) { return kFile.write(dir_fd, record); }

Result<std::optional<ImageRecord>> read_image(int dir_fd) { return kFile.read(dir_fd); }

std::vector<uint8_t> encode_image(const ImageRecord &record)
{
	PackedStrings keep;
	std::vector<CudaGpu> gpus, others;
	std::vector<CudaGpu *> gpu_ptrs, other_ptrs;
	encode_gpus(record.gpus, keep, gpus, gpu_ptrs);
	encode_gpus(record.other_gpus, keep, others, other_ptrs);
	std::vector<CudaProcess> procs(record.processes.size());
	std::vector<CudaProcess *> proc_ptrs;
	std::vector<std::vector<char *>> uuid_lists(record.processes.size());
	std::vector<RangeMessages> checkpoint_ranges(record.processes.size()), file_pages(record.processes.size());
	for (size_t i = 0; i < record.processes.size(); i++) {
		const ProcessRecord &p = record.processes[i];
		CudaProcess &m = procs[i];
		cuda_process__init(&m);
		m.pid = p.pid;
		m.has_ns_pid = true;
		m.ns_pid = p.ns_pid;
		m.initial_state = p.initial_state ? keep.keep(to_string(*p.initial_state)) : nullptr;
		for (const auto &u : p.gpu_uuids)
			uuid_lists[i].push_back(keep.keep(u.str()));
		m.n_gpu_uuids = uuid_lists[i].size();
		m.gpu_uuids = uuid_lists[i].data();
		m.has_state_bytes = m.has_lock_us = m.has_checkpoint_us = true;
		m.state_bytes = p.state_bytes;
		m.lock_us = p.lock_us;
		m.checkpoint_us = p.checkpoint_us;
		m.n_checkpoint_ranges = checkpoint_ranges[i].encode(p.checkpoint_ranges);
		m.checkpoint_ranges = checkpoint_ranges[i].ptrs.data();
		m.n_file_pages = file_pages[i].encode(p.file_pages);
		m.file_pages = file_pages[i].ptrs.data();
		proc_ptrs.push_back(&m);
	}
	CudaPluginImage img;
	cuda_plugin_image__init(&img);
	// Version 2 only where it matters: an image whose GPU state CRIU holds stays readable by older plugins.
	img.version = record.gpu_image_id.empty() ? 1 : kImageVersion;
	if (!record.gpu_image_id.empty())
		img.gpu_image_id = keep.keep(record.gpu_image_id);
	if (!record.gpu_checksums_id.empty())
		img.gpu_checksums_id = keep.keep(record.gpu_checksums_id);
	img.driver_version = keep.keep(record.driver_version);
	img.plugin_version = keep.keep(record.plugin_version);
	img.n_gpus = gpu_ptrs.size();
	img.gpus = gpu_ptrs.data();
	img.n_other_gpus = other_ptrs.size();
	img.other_gpus = other_ptrs.data();
	img.n_processes = proc_ptrs.size();
	img.processes = proc_ptrs.data();
	img.has_device_phase_us = img.has_created_unix = true;
	img.device_phase_us = record.device_phase_us;
	img.created_unix = record.created_unix;
	img.hostname = keep.keep(record.hostname);

	return pack_framed(kMagic, img, cuda_plugin_image__get_packed_size, cuda_plugin_image__pack);
}

Result<ImageRecord> decode_image(const uint8_t *data, size_t size)
{
	DecodeBudget budget{kImageDecodeBudget};
	ProtobufCAllocator allocator = {DecodeBudget::alloc, DecodeBudget::release, &budget};
	auto unpacked = unpack_framed(data, size, kMagic, "image", cuda_plugin_image__unpack,
				      cuda_plugin_image__free_unpacked, &allocator);
	if (!unpacked)
		return std::move(unpacked).error();
	const Unpacked<CudaPluginImage> &img = *unpacked;
	if (!img)
		return make_error(EINVAL, "corrupt image: its data does not parse%s",
				  budget.exhausted ? " within the memory any real image needs" : "");
	if (img->version > kImageVersion)
		return make_error(EPROTO,
				  "image format version %u was written by a newer cuda_plugin (%s); this plugin reads "
				  "versions up to %u: restore with that plugin version or newer",
				  img->version, printable(str_or_empty(img->plugin_version).substr(0, kImageMaxStringBytes)).c_str(),
				  kImageVersion);
	if (img->version == 0)
		return make_error(EINVAL, "corrupt image: version 0");
	if (auto st = check_limits(*img); !st)
		return std::move(st).error();
	ImageRecord r;
	r.version = img->version;
	r.driver_version = str_or_empty(img->driver_version);
	r.plugin_version = str_or_empty(img->plugin_version);
	auto gpus = decode_gpus(img->gpus, img->n_gpus);
	if (!gpus)
		return std::move(gpus).error();
	r.gpus = std::move(*gpus);
	auto others = decode_gpus(img->other_gpus, img->n_other_gpus);
	if (!others)
		return std::move(others).error();
	r.other_gpus = std::move(*others);
	for (size_t i = 0; i < img->n_processes; i++) {
		const CudaProcess *p = img->processes[i];
		if (p->pid <= 0)
			return make_error(EINVAL, "corrupt image: process %zu has pid %d", i, p->pid);
		ProcessRecord pr;
		pr.pid = p->pid;
		pr.ns_pid = p->has_ns_pid && p->ns_pid > 0 ? p->ns_pid : p->pid;
		if (p->initial_state) {
			auto state = parse_cuda_state(p->initial_state);
			if (!state)
				return std::move(state).error().context("corrupt image: process %d", p->pid);
			pr.initial_state = *state;
		}
		for (size_t j = 0; j < p->n_gpu_uuids; j++) {
			auto uuid = decode_uuid(p->gpu_uuids[j], "process GPU", j);
			if (!uuid)
				return std::move(uuid).error().context("process %d", p->pid);
			pr.gpu_uuids.push_back(*uuid);
		}
		pr.state_bytes = p->state_bytes;
		pr.lock_us = p->lock_us;
		pr.checkpoint_us = p->checkpoint_us;
		auto checkpoint = decode_ranges(p->checkpoint_ranges, p->n_checkpoint_ranges);
		auto files = decode_ranges(p->file_pages, p->n_file_pages);
		if (!checkpoint || !files)
			return std::move(checkpoint ? files : checkpoint).error().context("corrupt image: process %d", p->pid);
		pr.checkpoint_ranges = std::move(*checkpoint);
		pr.file_pages = std::move(*files);
		r.processes.push_back(std::move(pr));
	}
	r.device_phase_us = img->device_phase_us;
	r.created_unix = img->created_unix;
	r.hostname = str_or_empty(img->hostname);
	r.gpu_image_id = str_or_empty(img->gpu_image_id);
	r.gpu_checksums_id = str_or_empty(img->gpu_checksums_id);
	if (r.version >= 2 && r.gpu_image_id.empty())
		return make_error(EINVAL, "corrupt image: version %u without the id of its GPU image", r.version);
	return r;
}

} // namespace cuda_criu
