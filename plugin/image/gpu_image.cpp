#include "image/gpu_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <memory>
#include <random>

#include "base/format.h"
#include "base/text.h"
#include "cuda_plugin.pb-c.h"
#include "image/image_file.h"

namespace cuda_criu {
namespace {

constexpr char kIndexMagic[8] = {'C', 'U', 'D', 'A', 'G', 'P', 'U', 'I'};
constexpr char kDataMagic[8] = {'C', 'U', 'D', 'A', 'G', 'P', 'U', 'D'};
constexpr size_t kIdBytes = 32;
constexpr uint64_t kPage = 4096;

std::string str_or_empty(const char *s) { return s ? s : ""; }

// The data file's header: magic, the image id, zero padding to kGpuDataHeaderBytes.
std::vector<uint8_t> data_header(const std::string &id)
{
	std::vector<uint8_t> h(kGpuDataHeaderBytes, 0);
	std::memcpy(h.data(), kDataMagic, sizeof(kDataMagic));
	std::copy_n(id.begin(), std::min(id.size(), kIdBytes), h.begin() + sizeof(kDataMagic));
	return h;
}

bool plain_name(const std::string &n)
{
	return !n.empty() && n.size() <= 64 && n.find('/') == std::string::npos && n != "." && n != "..";
}

Status check_index(const GpuImageIndex &idx)
{
	if (idx.id.size() != kIdBytes)
		return make_error(EINVAL, "corrupt GPU image index: an id of %zu characters", idx.id.size());
	if (idx.chunk_bytes == 0 || idx.chunk_bytes % kPage || idx.chunk_bytes > (64u << 20))
		return make_error(EINVAL, "corrupt GPU image index: chunk size %u", idx.chunk_bytes);
	if (idx.files.size() > kGpuMaxFiles)
		return make_error(EINVAL, "corrupt GPU image index: %zu data files", idx.files.size());
	for (const GpuDataFile &f : idx.files) {
		if (!plain_name(f.name))
			return make_error(EINVAL, "corrupt GPU image index: data file name '%s'", printable(f.name).c_str());
		if (f.parent_depth > kGpuMaxParentDepth || (f.parent_depth > 0) != (f.id.size() == kIdBytes) ||
		    (f.parent_depth == 0 && !f.id.empty()))
			return make_error(EINVAL, "corrupt GPU image index: data file %s of a parent image (depth %u, id '%s')",
					  f.name.c_str(), f.parent_depth, printable(f.id).c_str());
	}
	if (idx.criu_pages && !idx.files.empty())
		return make_error(EINVAL, "corrupt GPU image index: checksums only, yet %zu data files", idx.files.size());
	for (const GpuProcessChunks &p : idx.processes) {
		uint64_t prev_end = 0;
		for (const GpuChunk &c : p.chunks) {
			if (idx.criu_pages) { // checksums only: no file, no offset
				if (c.len == 0 || c.len > idx.chunk_bytes || c.len % kPage || c.addr % kPage || c.addr < prev_end ||
				    c.addr + c.len < c.addr || c.compressed())
					return make_error(EINVAL,
							  "corrupt GPU image index: process %d, chunk at %#" PRIx64
							  " (%u bytes) is malformed",
							  p.ns_pid, c.addr, c.len);
				prev_end = c.addr + c.len;
				continue;
			}
			if (c.len > idx.chunk_bytes)
				return make_error(EINVAL,
						  "corrupt GPU image index: process %d, chunk at %#" PRIx64 " declares %u bytes, more "
						  "than the image's chunk size (%u)",
						  p.ns_pid, c.addr, c.len, idx.chunk_bytes);
			if (static_cast<uint32_t>(c.encoding) >= kChunkEncodings || (c.compressed() != (c.stored_len != 0)) ||
			    (c.compressed() && (c.stored_len == 0 || c.stored_len >= c.len)))
				return make_error(EINVAL,
						  "corrupt GPU image index: process %d, chunk at %#" PRIx64 " (%u bytes) is stored "
						  "as encoding %u in %u bytes",
						  p.ns_pid, c.addr, c.len, static_cast<unsigned>(c.encoding), c.stored_len);
			if (c.file >= idx.files.size() || c.len == 0 || c.len > idx.chunk_bytes || c.len % kPage ||
			    c.addr % kPage || c.offset % kPage || c.offset < kGpuDataHeaderBytes || c.addr < prev_end ||
			    c.addr + c.len < c.addr)
				return make_error(EINVAL,
						  "corrupt GPU image index: process %d, chunk at %#" PRIx64 " (%u bytes, file %u, "
						  "offset %" PRIu64 ") is malformed",
						  p.ns_pid, c.addr, c.len, c.file, c.offset);
			const GpuDataFile &f = idx.files[c.file];
			if (c.offset + c.stored() > f.size || c.offset + c.stored() < c.offset)
				return make_error(EINVAL,
						  "corrupt GPU image index: process %d, chunk at %#" PRIx64 " lies past the end of "
						  "%s (offset %" PRIu64 " + %u > %" PRIu64 ")",
						  p.ns_pid, c.addr, f.name.c_str(), c.offset, c.stored(), f.size);
			prev_end = c.addr + c.len;
		}
	}
	return {};
}

} // namespace

std::string gpu_data_file_name(unsigned n) { return format("cuda-gpu-%u.img", n); }

std::string GpuDataFile::path() const
{
	std::string p;
	for (uint32_t i = 0; i < parent_depth; i++)
		p += "parent/";
	return p + name;
}

uint64_t GpuImageIndex::parent_bytes() const
{
	uint64_t n = 0;
	for (const GpuProcessChunks &p : processes)
		for (const GpuChunk &c : p.chunks)
			n += !criu_pages && c.file < files.size() && files[c.file].parent_depth ? c.len : 0;
	return n;
}

uint64_t GpuProcessChunks::stored_bytes() const
{
	uint64_t n = 0;
	for (const GpuChunk &c : chunks)
		n += c.len;
	return n;
}

std::vector<uint64_t> GpuProcessChunks::decoded_offsets() const
{
	constexpr uint64_t kHugePage = 2 << 20;
	std::vector<uint64_t> at;
	uint64_t n = 0;
	for (const GpuChunk &c : chunks) {
		if (c.compressed())
			n += (c.addr - n) & (kHugePage - 1);
		at.push_back(n);
		n += c.compressed() ? c.len : 0;
	}
	at.push_back(n);
	return at;
}

uint64_t GpuProcessChunks::decoded_bytes() const
{
	return decoded_offsets().back();
}

const GpuProcessChunks *GpuImageIndex::find(int ns_pid) const
{
	for (const GpuProcessChunks &p : processes)
		if (p.ns_pid == ns_pid)
			return &p;
	return nullptr;
}

std::string new_gpu_image_id()
{
	std::random_device rd;
	std::string id;
	while (id.size() < kIdBytes)
		id += format("%08x", rd());
	return id.substr(0, kIdBytes);
}

std::vector<uint8_t> encode_gpu_index(const GpuImageIndex &index)
{
	PackedStrings keep;
	std::vector<CudaGpuFile> files(index.files.size());
	std::vector<CudaGpuFile *> file_ptrs;
	for (size_t i = 0; i < index.files.size(); i++) {
		cuda_gpu_file__init(&files[i]);
		files[i].name = keep.keep(index.files[i].name);
		files[i].size = index.files[i].size;
		files[i].has_data_bytes = true;
		files[i].data_bytes = index.files[i].data_bytes;
		if (index.files[i].parent_depth) {
			files[i].has_parent_depth = true;
			files[i].parent_depth = index.files[i].parent_depth;
			files[i].id = keep.keep(index.files[i].id);
		}
		file_ptrs.push_back(&files[i]);
	}
	struct Columns {
		std::vector<uint64_t> addr, offset;
		std::vector<uint32_t> len, file, crc, stored_len, encoding;
	};
	bool compressed = false;
	std::vector<Columns> cols(index.processes.size());
	std::vector<CudaGpuChunks> procs(index.processes.size());
	std::vector<CudaGpuChunks *> proc_ptrs;
	for (size_t i = 0; i < index.processes.size(); i++) {
		const GpuProcessChunks &p = index.processes[i];
		Columns &c = cols[i];
		for (const GpuChunk &ch : p.chunks) {
			c.addr.push_back(ch.addr);
			c.len.push_back(ch.len);
			c.file.push_back(ch.file);
			c.offset.push_back(ch.offset);
			c.crc.push_back(ch.crc);
			c.stored_len.push_back(ch.stored_len);
			c.encoding.push_back(static_cast<uint32_t>(ch.encoding));
			compressed = compressed || ch.compressed();
		}
		CudaGpuChunks &m = procs[i];
		cuda_gpu_chunks__init(&m);
		m.ns_pid = p.ns_pid;
		m.has_pid = true;
		m.pid = p.pid;
		m.n_addr = m.n_len = m.n_file = m.n_offset = m.n_crc32c = p.chunks.size();
		m.addr = c.addr.data();
		m.len = c.len.data();
		m.file = c.file.data();
		m.offset = c.offset.data();
		m.crc32c = c.crc.data();
		if (std::any_of(p.chunks.begin(), p.chunks.end(), [](const GpuChunk &ch) { return ch.compressed(); })) {
			m.n_stored_len = m.n_encoding = p.chunks.size();
			m.stored_len = c.stored_len.data();
			m.encoding = c.encoding.data();
		}
		m.has_zero_bytes = true;
		m.zero_bytes = p.zero_bytes;
		proc_ptrs.push_back(&m);
	}
	CudaGpuImage img;
	cuda_gpu_image__init(&img);
	bool has_parent = std::any_of(index.files.begin(), index.files.end(),
				      [](const GpuDataFile &f) { return f.parent_depth > 0; });
	// The oldest version that reads it right: older plugins refuse what they cannot read by its version.
	img.version = compressed ? 3 : has_parent ? 2 : 1;
	img.id = keep.keep(index.id);
	img.has_chunk_bytes = true;
	img.chunk_bytes = index.chunk_bytes;
	img.n_files = file_ptrs.size();
	img.files = file_ptrs.data();
	img.n_processes = proc_ptrs.size();
	img.processes = proc_ptrs.data();
	img.has_write_us = true;
	img.write_us = index.write_us;
	img.has_criu_pages = index.criu_pages;
	img.criu_pages = index.criu_pages;
	size_t len = cuda_gpu_image__get_packed_size(&img);
	std::vector<uint8_t> out = framed_buffer(kIndexMagic, len);
	cuda_gpu_image__pack(&img, out.data() + kImageHeaderBytes);
	return out;
}

Result<GpuImageIndex> decode_gpu_index(const uint8_t *data, size_t size)
{
	auto len = unframe(data, size, kIndexMagic, "GPU image index");
	if (!len)
		return std::move(len).error();
	DecodeBudget budget{kGpuIndexMaxBytes * 2};
	ProtobufCAllocator allocator = {DecodeBudget::alloc, DecodeBudget::release, &budget};
	auto free_image = [&allocator](CudaGpuImage *p) { cuda_gpu_image__free_unpacked(p, &allocator); };
	std::unique_ptr<CudaGpuImage, decltype(free_image)> img(cuda_gpu_image__unpack(&allocator, *len, data + kImageHeaderBytes),
							       free_image);
	if (!img)
		return make_error(EINVAL, "corrupt GPU image index: its data does not parse");
	if (img->version == 0 || img->version > kGpuImageVersion)
		return make_error(EPROTO, "GPU image index version %u: this plugin reads version %u", img->version,
				  kGpuImageVersion);
	GpuImageIndex idx;
	idx.id = str_or_empty(img->id);
	idx.chunk_bytes = img->has_chunk_bytes ? img->chunk_bytes : kGpuChunkBytes;
	idx.write_us = img->write_us;
	idx.criu_pages = img->criu_pages;
	for (size_t i = 0; i < img->n_files; i++)
		idx.files.push_back({str_or_empty(img->files[i]->name), img->files[i]->size, img->files[i]->data_bytes,
				     img->files[i]->parent_depth, str_or_empty(img->files[i]->id)});
	for (size_t i = 0; i < img->n_processes; i++) {
		const CudaGpuChunks *m = img->processes[i];
		size_t n = m->n_addr;
		if (m->n_len != n || m->n_file != n || m->n_offset != n || m->n_crc32c != n ||
		    (m->n_stored_len != m->n_encoding) || (m->n_stored_len && m->n_stored_len != n) ||
		    (m->n_stored_len && img->version < 3))
			return make_error(EINVAL, "corrupt GPU image index: process %d has chunk lists of different lengths",
					  m->ns_pid);
		GpuProcessChunks p;
		p.ns_pid = m->ns_pid;
		p.pid = m->has_pid ? m->pid : m->ns_pid;
		p.zero_bytes = m->zero_bytes;
		p.chunks.reserve(n);
		for (size_t j = 0; j < n; j++)
			p.chunks.push_back({m->addr[j], m->len[j], m->file[j], m->offset[j], m->crc32c[j],
					    m->n_encoding ? static_cast<ChunkEncoding>(m->encoding[j]) : ChunkEncoding::Raw,
					    m->n_stored_len ? m->stored_len[j] : 0});
		idx.processes.push_back(std::move(p));
	}
	if (auto st = check_index(idx); !st)
		return std::move(st).error();
	return idx;
}

namespace {
const RecordFile<GpuImageIndex> kGpuIndexFile{kGpuIndexFileName, kGpuIndexMaxBytes, encode_gpu_index, decode_gpu_index};
} // namespace

Status write_gpu_index(int dir_fd, const GpuImageIndex &index) { return kGpuIndexFile.write(dir_fd, index); }

Result<std::optional<GpuImageIndex>> read_gpu_index(int dir_fd) { return kGpuIndexFile.read(dir_fd); }

Result<std::optional<GpuParentImage>> read_parent_gpu_image(int dir_fd)
{
	UniqueFd fd(openat(dir_fd, "parent", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	if (!fd.valid())
		return std::optional<GpuParentImage>();
	auto idx = read_gpu_index(fd.get());
	if (!idx)
		return std::move(idx).error().context("%s", "the parent image (criu dump --prev-images-dir)");
	if (!*idx || (*idx)->criu_pages)
		return std::optional<GpuParentImage>();
	return std::optional<GpuParentImage>(GpuParentImage{std::move(fd), std::move(**idx)});
}

void remove_gpu_image(int dir_fd, const std::vector<GpuDataFile> &files)
{
	for (const GpuDataFile &f : files)
		if (!f.parent_depth) // a parent's file is the parent's
			unlinkat(dir_fd, f.name.c_str(), 0);
	unlinkat(dir_fd, kGpuIndexFileName, 0);
}

Result<GpuDataWriter> GpuDataWriter::create(int dir_fd, const std::string &name, const std::string &id)
{
	UniqueFd fd(openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
	if (!fd.valid())
		return errno_error("create %s in the image directory", name.c_str());
	GpuDataWriter w(std::move(fd), name);
	std::vector<uint8_t> h = data_header(id);
	if (auto st = w.write(0, h.data(), h.size()); !st)
		return std::move(st).error();
	return w;
}

Status GpuDataWriter::write(uint64_t offset, const void *data, size_t len)
{
	const auto *p = static_cast<const uint8_t *>(data);
	while (len) {
		ssize_t n = pwrite(fd_.get(), p, len, static_cast<off_t>(offset));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return errno_error("write %s at offset %" PRIu64, name_.c_str(), offset);
		p += n;
		offset += static_cast<uint64_t>(n);
		len -= static_cast<size_t>(n);
	}
	return {};
}

Status GpuDataWriter::finish(uint64_t size)
{
	// Not synced, as CRIU does not sync its pages images: a sync would bind the dump to the disk's rate
	// (measured on the GPU machine: 2.2 GB/s with 16 writers instead of ~10). Whatever a crash loses
	// shows at restore as a file cut short or a failed checksum, never as wrong GPU memory.
	if (ftruncate(fd_.get(), static_cast<off_t>(size)) != 0)
		return errno_error("set the size of %s", name_.c_str());
	fd_.reset();
	return {};
}

Result<GpuDataReader> GpuDataReader::open(int dir_fd, const GpuDataFile &file, const std::string &id)
{
	// A parent's file is found through CRIU's parent links (the path has them); the file itself is
	// never a link.
	std::string path = file.path();
	std::string what = file.parent_depth ? format("%s (a file of the parent image this one references: criu dump "
						      "--prev-images-dir; the parent images must stay in place)",
						      path.c_str())
					     : path;
	UniqueFd fd(openat(dir_fd, path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
	if (!fd.valid())
		return errno_error("open %s (a file of the GPU image) in the image directory", what.c_str());
	struct stat st {};
	if (fstat(fd.get(), &st) != 0)
		return errno_error("stat %s", path.c_str());
	if (!S_ISREG(st.st_mode))
		return make_error(EINVAL, "%s is not a regular file", path.c_str());
	if (static_cast<uint64_t>(st.st_size) < file.size)
		return make_error(EIO,
				  "%s is cut short: %" PRIu64 " bytes, the index records %" PRIu64
				  " (the image was copied incompletely: copy it again)",
				  what.c_str(), static_cast<uint64_t>(st.st_size), file.size);
	GpuDataReader r(std::move(fd), path);
	std::vector<uint8_t> h(kGpuDataHeaderBytes);
	if (auto s = r.read(0, h.data(), h.size()); !s)
		return std::move(s).error();
	if (std::memcmp(h.data(), kDataMagic, sizeof(kDataMagic)) != 0)
		return make_error(EINVAL, "%s is not a data file of a GPU image (bad magic)", path.c_str());
	const std::string &want = file.parent_depth ? file.id : id;
	if (std::memcmp(h.data() + sizeof(kDataMagic), want.data(), std::min(want.size(), kIdBytes)) != 0)
		return file.parent_depth
			       ? make_error(EINVAL,
					    "%s is not the parent image's file this image references (its GPU image id differs): "
					    "the parent image was replaced by another dump; restore with the parent it was "
					    "dumped against",
					    path.c_str())
			       : make_error(EINVAL,
					    "%s belongs to another dump (its GPU image id differs from cuda-gpu.img's): the image "
					    "directory mixes files of two dumps",
					    path.c_str());
	return r;
}

Result<std::vector<GpuDataReader>> GpuDataReader::open_all(int dir_fd, const GpuImageIndex &index)
{
	std::vector<GpuDataReader> readers;
	for (const GpuDataFile &f : index.files) {
		auto r = open(dir_fd, f, index.id);
		if (!r)
			return std::move(r).error();
		readers.push_back(std::move(*r));
	}
	return readers;
}

Status GpuDataReader::read(uint64_t offset, void *data, size_t len) const
{
	auto *p = static_cast<uint8_t *>(data);
	uint64_t at = offset;
	while (len) {
		ssize_t n = pread(fd_.get(), p, len, static_cast<off_t>(at));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno_error("read %s at offset %" PRIu64, name_.c_str(), at);
		if (n == 0)
			return make_error(EIO, "%s ends at offset %" PRIu64 ", before the data the index records there",
					  name_.c_str(), at);
		p += n;
		at += static_cast<uint64_t>(n);
		len -= static_cast<size_t>(n);
	}
	return {};
}

} // namespace cuda_criu
