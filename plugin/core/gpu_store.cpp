#include "core/gpu_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <thread>
#include <unordered_map>

#include "base/clock.h"
#include "base/crc32c.h"
#include "base/format.h"
#include "base/log.h"
#include "base/text.h"
#include "core/parallel.h"
#include "image/chunk_codec.h"
#include "os/unique_fd.h"

namespace cuda_criu {
namespace {

constexpr uint64_t kPage = 4096;
constexpr unsigned kMaxAutoThreads = 16;
constexpr uint64_t kBytesPerThread = 64ULL << 20;
constexpr unsigned kProgressEveryMs = 3000;

// One chunk of work: bytes [addr, addr + len) of target `target`, and where it is stored.
struct Piece {
	size_t target = 0;
	uint64_t addr = 0;
	uint32_t len = 0;
	const GpuChunk *chunk = nullptr; // load only
	uint8_t *decoded = nullptr;      // load only: where a compressed chunk is decoded (GpuLoadTarget::decoded)
};

// The chunks of a save, handed out in batches of consecutive chunks to whichever writer is free: where the
// data lies (weights at one end, a zeroed KV arena at the other) does not decide how long one writer
// takes. A batch's chunks stay consecutive in its writer's file, so that CRIU maps them as one run: at most
// 64 chunks (128 MiB) a batch keeps a process's runs below mapped_restore's 4096 up to 512 GiB of data.
// A restore's readers take the chunks the same way: how well each compresses does not decide either.
class Batches {
public:
	Batches(size_t pieces, unsigned writers)
		: count_(pieces), size_(std::clamp<size_t>(pieces / (4 * size_t{std::max(1u, writers)}), 1, 64))
	{
	}
	// The next batch's [first, last), or an empty range once all are taken.
	std::pair<size_t, size_t> next()
	{
		size_t first = std::min(next_.fetch_add(size_, std::memory_order_relaxed), count_);
		return {first, std::min(first + size_, count_)};
	}
	size_t batches() const { return (count_ + size_ - 1) / size_; }

private:
	size_t count_, size_;
	std::atomic<size_t> next_{0};
};

bool page_is_zero(const uint64_t *p)
{
	uint64_t acc = 0;
	for (size_t i = 0; i < kPage / sizeof(uint64_t); i++)
		acc |= p[i];
	return acc == 0;
}

bool all_zero(const uint64_t *words, size_t pages)
{
	for (size_t pg = 0; pg < pages; pg++)
		if (!page_is_zero(words + pg * (kPage / sizeof(uint64_t))))
			return false;
	return true;
}

// Logs progress every few seconds while the workers run (on the waiting thread).
JobWatch progress_watch(const char *what, const std::atomic<uint64_t> &done, uint64_t total)
{
	auto last = std::make_shared<uint64_t>(now_us());
	uint64_t start = *last;
	return [what, &done, total, last, start](const std::vector<bool> &) -> std::vector<std::pair<size_t, Error>> {
		uint64_t now = now_us();
		if (now - *last >= kProgressEveryMs * 1000ULL) {
			*last = now;
			uint64_t d = done.load();
			LOG_INFO("%s: %s of %s (%.0f%%), %.2f GB/s", what, human_bytes(d).c_str(), human_bytes(total).c_str(),
				 total ? 100.0 * static_cast<double>(d) / static_cast<double>(total) : 100.0,
				 static_cast<double>(d) / 1e3 / static_cast<double>(std::max<uint64_t>(now - start, 1)));
		}
		return {};
	};
}

// The parent image's stored chunks by CRC-32C, to reference instead of writing: the references become
// data files of this index from first_file on, one per parent file.
struct ParentChunks {
	std::vector<GpuDataReader> readers;
	std::unordered_multimap<uint32_t, GpuChunk> by_crc; // the parent's chunks, files numbered in its index
	uint32_t first_file = 0;

	// The parent's chunk with exactly these bytes (read back, decoded where compressed, and compared), its
	// file numbered in this index: raw or compressed, it is referenced as the parent stored it. nullopt when
	// there is none. scratch, decoded: chunk_bytes of room each.
	Result<std::optional<GpuChunk>> find(const uint8_t *bytes, uint32_t len, uint32_t crc, uint8_t *scratch,
					     uint8_t *decoded, ChunkCodec &codec) const
	{
		auto [it, end] = by_crc.equal_range(crc);
		for (; it != end; ++it) {
			const GpuChunk &r = it->second;
			if (r.len != len)
				continue;
			Status st = readers[r.file].read(r.offset, scratch, r.stored());
			if (st && r.compressed())
				st = codec.decode(r.encoding, scratch, r.stored(), decoded, len);
			if (!st)
				return std::move(st).error().context("compare with the parent image's chunk in %s at offset %" PRIu64,
								      readers[r.file].name().c_str(), r.offset);
			if (std::memcmp(r.compressed() ? decoded : scratch, bytes, len) == 0) {
				GpuChunk ref = r;
				ref.file += first_file;
				return std::optional<GpuChunk>(ref);
			}
		}
		return std::optional<GpuChunk>();
	}
};

// One line on where a pool's time went (thread-seconds summed over its workers), to tell a slow step from
// workers waiting: "GPU image write: 16 writers in 2.35 s; thread-seconds: read 10.1, ...".
void log_steps(const char *what, unsigned workers, uint64_t wall_us, const StepTimes &s, const char *code)
{
	auto sec = [](uint64_t us) { return static_cast<double>(us) / 1e6; };
	LOG_INFO("%s: %u worker(s) in %.2f s; thread-seconds: read %.1f, %s %.1f, write %.1f; CPU %.1f", what, workers,
		 sec(wall_us), sec(s.read_us), code, sec(s.code_us), sec(s.write_us), sec(s.cpu_us));
}

struct SliceOut {
	std::vector<std::pair<size_t, GpuChunk>> chunks; // target, chunk
	std::vector<uint64_t> zero_bytes;                // per target
	GpuDataFile file;
	StepTimes steps;
};

// One writer's slice: each chunk read out of its process and, with a data file (dir_fd >= 0), stored there
// unless all zero; without one (dir_fd < 0: CRIU's pages hold the state) only its checksum is kept, for
// every chunk.
Status save_slice(Host &host, int dir_fd, const std::vector<GpuSaveTarget> &targets, const std::vector<Piece> &pieces,
		  Batches &batches, unsigned index, const std::string &id, uint32_t chunk_bytes,
		  const ParentChunks *parent, int zstd_level, std::atomic<uint64_t> &done, const std::atomic<bool> &stop,
		  SliceOut &out)
{
	out.zero_bytes.assign(targets.size(), 0);
	std::optional<GpuDataWriter> writer;
	if (dir_fd >= 0) {
		out.file.name = gpu_data_file_name(index);
		auto w = GpuDataWriter::create(dir_fd, out.file.name, id);
		if (!w)
			return std::move(w).error();
		writer = std::move(*w);
	}
	std::vector<uint64_t> buf(chunk_bytes / sizeof(uint64_t));
	auto *bytes = reinterpret_cast<uint8_t *>(buf.data());
	std::vector<uint8_t> scratch(parent ? chunk_bytes : 0), decoded(parent ? chunk_bytes : 0);
	ChunkCodec codec;
	StepClock clock(out.steps);
	uint64_t offset = kGpuDataHeaderBytes;
	for (std::pair<size_t, size_t> batch{0, 0}; !stop.load(std::memory_order_relaxed);) {
		if (batch.first == batch.second && (batch = batches.next()).first == batch.second)
			break;
		const Piece &p = pieces[batch.first++];
		pid_t pid = targets[p.target].pid;
		clock.lap(&StepTimes::code_us);
		if (auto st = host.read_memory(pid, p.addr, bytes, p.len); !st)
			return std::move(st).error().context("save the GPU state of pid %d", pid);
		clock.lap(&StepTimes::read_us);
		if (!writer) {
			out.chunks.push_back({p.target, {p.addr, p.len, 0, 0, crc32c(bytes, p.len)}});
			done.fetch_add(p.len, std::memory_order_relaxed);
			continue;
		}
		// With a parent image, a chunk it holds already is referenced there, not written. Without one the
		// checksum waits until the chunk is known to be stored (all-zero chunks need none).
		std::optional<uint32_t> crc;
		if (parent) {
			crc = crc32c(bytes, p.len);
			auto ref = parent->find(bytes, p.len, *crc, scratch.data(), decoded.data(), codec);
			if (!ref)
				return std::move(ref).error().context("save the GPU state of pid %d", pid);
			if (*ref) {
				GpuChunk c = **ref;
				c.addr = p.addr;
				out.chunks.push_back({p.target, c});
				done.fetch_add(p.len, std::memory_order_relaxed);
				continue;
			}
		}
		size_t pages = p.len / kPage, run = 0, stored = 0;
		// Compressed: an all-zero chunk is left out as ever (without a second look at its pages below), one
		// that does not shrink is stored as below.
		if (zstd_level > 0 && all_zero(buf.data(), pages)) {
			out.zero_bytes[p.target] += p.len;
			done.fetch_add(p.len, std::memory_order_relaxed);
			continue;
		}
		if (zstd_level > 0) {
			ChunkCodec::Encoded e = codec.encode(bytes, p.len, zstd_level);
			clock.lap(&StepTimes::code_us);
			if (e.encoding != ChunkEncoding::Raw) {
				if (auto st = writer->write(offset, codec.out(), e.stored_len); !st)
					return std::move(st).error().context("save the GPU state of pid %d", pid);
				clock.lap(&StepTimes::write_us);
				out.chunks.push_back({p.target, {p.addr, p.len, index, offset, crc ? *crc : crc32c(bytes, p.len),
								 e.encoding, static_cast<uint32_t>(e.stored_len)}});
				out.file.data_bytes += e.stored_len;
				offset += (e.stored_len + kPage - 1) / kPage * kPage; // chunks start on pages
				done.fetch_add(p.len, std::memory_order_relaxed);
				continue;
			}
		}
		// Runs of non-zero pages are written; zero pages inside a stored chunk stay holes.
		for (size_t pg = 0; pg <= pages; pg++) {
			bool data = pg < pages && !page_is_zero(buf.data() + pg * (kPage / sizeof(uint64_t)));
			if (data) {
				run++;
				continue;
			}
			if (run) {
				size_t first = pg - run;
				clock.lap(&StepTimes::code_us);
				if (auto st = writer->write(offset + first * kPage, bytes + first * kPage, run * kPage); !st)
					return std::move(st).error().context("save the GPU state of pid %d", pid);
				clock.lap(&StepTimes::write_us);
				stored += run;
				run = 0;
			}
		}
		done.fetch_add(p.len, std::memory_order_relaxed);
		if (!stored) {
			out.zero_bytes[p.target] += p.len;
			continue;
		}
		out.chunks.push_back({p.target, {p.addr, p.len, index, offset, crc ? *crc : crc32c(bytes, p.len)}});
		out.file.data_bytes += stored * kPage;
		offset += p.len;
	}
	out.file.size = offset;
	return writer ? writer->finish(offset) : Status();
}

} // namespace

unsigned gpu_io_threads(unsigned io_threads, uint64_t bytes)
{
	if (io_threads)
		return io_threads;
	unsigned cores = std::max(1u, std::thread::hardware_concurrency());
	uint64_t by_size = std::max<uint64_t>(1, bytes / kBytesPerThread);
	return static_cast<unsigned>(std::min<uint64_t>({kMaxAutoThreads, cores, by_size}));
}

namespace {

// The parent's files as data files of the child's index (one level further up), those that chunks
// reference, in the order of first use; chunks' file numbers from parent.first_file on renumbered.
void add_parent_files(GpuImageIndex &index, const GpuImageIndex &parent, uint32_t first_file)
{
	std::vector<int64_t> renumber(parent.files.size(), -1);
	for (GpuProcessChunks &p : index.processes)
		for (GpuChunk &c : p.chunks) {
			if (c.file < first_file)
				continue;
			uint32_t k = c.file - first_file;
			if (renumber[k] < 0) {
				const GpuDataFile &f = parent.files[k];
				renumber[k] = static_cast<int64_t>(index.files.size());
				index.files.push_back({f.name, f.size, f.data_bytes, f.parent_depth + 1,
						       f.parent_depth ? f.id : parent.id});
			}
			c.file = static_cast<uint32_t>(renumber[k]);
		}
}

Result<GpuImageIndex> save_or_checksum(Host &host, int dir_fd, const std::vector<GpuSaveTarget> &targets,
				       const std::string &id, unsigned threads, const GpuParentImage *parent_image,
				       uint32_t chunk_bytes, int zstd_level)
{
	uint64_t t0 = now_us();
	std::vector<Piece> pieces;
	uint64_t total = 0;
	for (size_t t = 0; t < targets.size(); t++)
		for (const MemoryRange &r : targets[t].ranges)
			for (uint64_t a = r.start; a < r.end; a += chunk_bytes) {
				auto len = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes, r.end - a));
				pieces.push_back({t, a, len, nullptr});
				total += len;
			}
	Batches batches(pieces.size(), threads);
	unsigned writers = static_cast<unsigned>(std::min<size_t>(std::max(1u, threads), std::max<size_t>(1, batches.batches())));
	std::optional<ParentChunks> parent;
	if (parent_image && dir_fd >= 0 && parent_image->index.chunk_bytes == chunk_bytes) {
		auto readers = GpuDataReader::open_all(parent_image->dir.get(), parent_image->index);
		if (!readers) {
			LOG_WARN("the parent image's GPU image cannot be read (%s): every chunk is written",
				 readers.error().message().c_str());
		} else {
			parent.emplace();
			parent->readers = std::move(*readers);
			parent->first_file = writers;
			for (const GpuProcessChunks &p : parent_image->index.processes)
				for (const GpuChunk &c : p.chunks)
					parent->by_crc.emplace(c.crc, c);
		}
	}
	std::vector<SliceOut> outs(writers);
	std::atomic<uint64_t> done{0};
	std::atomic<bool> stop{false};
	std::vector<Job> jobs;
	jobs.reserve(writers);
	for (unsigned w = 0; w < writers; w++)
		jobs.push_back({format("write %s", gpu_data_file_name(w).c_str()), [&, w]() -> Status {
					Status st = save_slice(host, dir_fd, targets, pieces, batches, w, id, chunk_bytes,
							       parent ? &*parent : nullptr, zstd_level, done, stop, outs[w]);
					if (!st)
						stop = true;
					return st;
				}});
	std::vector<Status> results = run_jobs(std::move(jobs), 0, 0,
					       progress_watch(dir_fd >= 0 ? "GPU image written" : "GPU state checksummed", done, total));
	for (const Status &st : results)
		if (!st) {
			for (unsigned w = 0; dir_fd >= 0 && w < writers; w++)
				unlinkat(dir_fd, gpu_data_file_name(w).c_str(), 0);
			return st.error();
		}
	GpuImageIndex index;
	index.id = id;
	index.chunk_bytes = chunk_bytes;
	index.criu_pages = dir_fd < 0;
	for (const GpuSaveTarget &t : targets)
		index.processes.push_back({t.ns_pid, t.pid, {}, 0});
	StepTimes steps;
	for (SliceOut &o : outs) {
		steps += o.steps;
		if (dir_fd >= 0)
			index.files.push_back(o.file);
		for (auto &[t, c] : o.chunks)
			index.processes[t].chunks.push_back(c);
		for (size_t t = 0; t < targets.size(); t++)
			index.processes[t].zero_bytes += o.zero_bytes[t];
	}
	for (GpuProcessChunks &p : index.processes) // the writers took batches in any order
		std::sort(p.chunks.begin(), p.chunks.end(), [](const GpuChunk &a, const GpuChunk &b) { return a.addr < b.addr; });
	if (parent)
		add_parent_files(index, parent_image->index, parent->first_file);
	index.write_us = now_us() - t0;
	log_steps(dir_fd >= 0 ? "GPU image write" : "GPU state checksums", writers, index.write_us, steps,
		  dir_fd >= 0 ? (zstd_level > 0 ? "check for zeros, compress" : "check for zeros") : "checksum");
	return index;
}

// One chunk of a load: read (from its file, decoded; or from the process, checksums only), checked, and
// written into the process unless CRIU maps it. The scratch buffers are the calling reader's.
Status load_chunk(Host &host, const GpuImageIndex &index, const std::vector<GpuDataReader> &readers,
		  const GpuLoadTarget &t, const Piece &p, std::vector<uint64_t> &buf, std::vector<uint8_t> &stored,
		  ChunkCodec &codec, StepClock &clock)
{
	const GpuChunk &c = *p.chunk;
	// Decoded straight into the memory CRIU maps, or into buf.
	uint8_t *out = p.decoded ? p.decoded : reinterpret_cast<uint8_t *>(buf.data());
	// Its pages allocated in one call, not a fault each (before 5.14: EINVAL, faults). Out of memory, the
	// restore stops here rather than at a fault in the decoder.
	if (p.decoded && madvise(p.decoded, c.len, MADV_POPULATE_WRITE) != 0 && errno == ENOMEM)
		return make_error(ENOMEM,
				  "no memory to decode the GPU state at %#" PRIx64 " (%u bytes) into: a restore holds each "
				  "process's decoded GPU state until the driver has restored it; free memory, or restore "
				  "with CUDA_CRIU_MAP_IMAGE=off (the plugin then writes it into the process itself)",
				  c.addr, c.len);
	clock.lap(&StepTimes::write_us);
	Status st;
	if (index.criu_pages) {
		st = host.read_memory(t.pid, c.addr, buf.data(), c.len);
	} else if (!c.compressed()) {
		st = readers[c.file].read(c.offset, buf.data(), c.len);
	} else {
		stored.resize(c.stored_len);
		st = readers[c.file].read(c.offset, stored.data(), c.stored_len);
		clock.lap(&StepTimes::read_us);
		if (st)
			if (Status d = codec.decode(c.encoding, stored.data(), c.stored_len, out, c.len); !d)
				st = make_error(EBADMSG,
						"GPU state at %#" PRIx64 " (%u bytes, %s in %u bytes) in %s at offset %" PRIu64
						" does not decode (%s): the image is damaged; restore from an intact copy "
						"(cuda-criu inspect --verify checks one)",
						c.addr, c.len, chunk_encoding_name(c.encoding), c.stored_len,
						readers[c.file].name().c_str(), c.offset, d.error().message().c_str());
	}
	clock.lap(c.compressed() ? &StepTimes::code_us : &StepTimes::read_us);
	uint32_t crc = st ? crc32c(out, c.len) : c.crc;
	if (crc != c.crc && index.criu_pages)
		st = make_error(EBADMSG,
				"GPU state at %#" PRIx64 " (%u bytes), as CRIU restored it from its pages images, fails its "
				"checksum (CRC-32C %08x, recorded %08x): the image's pages files are damaged; restore from "
				"an intact copy",
				c.addr, c.len, crc, c.crc);
	else if (crc != c.crc && st)
		st = make_error(EBADMSG,
				"GPU state at %#" PRIx64 " (%u bytes) in %s at offset %" PRIu64 " fails its checksum (CRC-32C "
				"%08x, recorded %08x): the image is damaged; restore from an intact copy (cuda-criu inspect "
				"--verify checks one)",
				c.addr, c.len, readers[c.file].name().c_str(), c.offset, crc, c.crc);
	clock.lap(&StepTimes::code_us);
	// A chunk in a parent's file, or compressed and not decoded into memory CRIU maps, is
	// never mapped by CRIU: always written into a restored process.
	if (st && !index.criu_pages && t.pid && !p.decoded &&
	    (t.write || index.files[c.file].parent_depth || c.compressed()))
		st = host.write_memory(t.pid, c.addr, buf.data(), c.len);
	clock.lap(&StepTimes::write_us);
	return st;
}

} // namespace

Result<GpuImageIndex> save_gpu_state(Host &host, int dir_fd, const std::vector<GpuSaveTarget> &targets,
				     const std::string &id, unsigned threads, uint32_t chunk_bytes,
				     const GpuParentImage *parent, int zstd_level)
{
	return save_or_checksum(host, dir_fd, targets, id, threads, parent, chunk_bytes, zstd_level);
}

Result<GpuImageIndex> checksum_gpu_state(Host &host, const std::vector<GpuSaveTarget> &targets, const std::string &id,
					 unsigned threads, uint32_t chunk_bytes)
{
	return save_or_checksum(host, -1, targets, id, threads, nullptr, chunk_bytes, 0);
}

Status check_gpu_files(int dir_fd, const GpuImageIndex &index)
{
	auto readers = GpuDataReader::open_all(dir_fd, index);
	if (!readers)
		return std::move(readers).error();
	return {};
}

Status load_gpu_state(Host &host, int dir_fd, const GpuImageIndex &index, const std::vector<GpuLoadTarget> &targets,
		      unsigned threads, const std::atomic<bool> *cancel, LazyDecoded *lazy)
{
	auto opened = GpuDataReader::open_all(dir_fd, index);
	if (!opened)
		return std::move(opened).error();
	const std::vector<GpuDataReader> &readers = *opened;
	std::vector<Piece> pieces;
	uint64_t total = 0;
	for (size_t t = 0; t < targets.size(); t++) {
		const GpuProcessChunks *p = index.find(targets[t].ns_pid);
		if (!p)
			continue;
		std::vector<uint64_t> decoded_at = p->decoded_offsets();
		for (size_t i = 0; i < p->chunks.size(); i++) {
			const GpuChunk &c = p->chunks[i];
			if (targets[t].skip_compressed && c.compressed())
				continue;
			uint8_t *decoded = targets[t].decoded && c.compressed() ? targets[t].decoded + decoded_at[i] : nullptr;
			pieces.push_back({t, c.addr, c.len, &c, decoded});
			total += c.len;
		}
	}
	if (pieces.empty())
		return {};
	// Each piece is taken once: from a batch, or first where a process waits for it (lazy).
	std::vector<std::atomic<bool>> taken(pieces.size());
	std::map<std::pair<pid_t, uint64_t>, size_t> lazy_pieces;
	for (size_t i = 0; lazy && i < pieces.size(); i++)
		if (pieces[i].decoded && lazy->has(targets[pieces[i].target].ns_pid))
			lazy_pieces.emplace(std::make_pair(targets[pieces[i].target].ns_pid, pieces[i].addr), i);
	auto next_wanted = [&]() -> std::optional<size_t> {
		while (auto w = lazy ? lazy->wanted() : std::nullopt)
			if (auto it = lazy_pieces.find(*w); it != lazy_pieces.end() && !taken[it->second].exchange(true))
				return it->second;
		return std::nullopt;
	};
	unsigned workers = static_cast<unsigned>(std::min<size_t>(std::max(1u, threads), pieces.size()));
	Batches batches(pieces.size(), workers);
	std::atomic<uint64_t> done{0};
	std::atomic<bool> stop{false};
	std::vector<Job> jobs;
	jobs.reserve(workers);
	std::vector<StepTimes> steps(workers);
	uint64_t t0 = now_us();
	for (unsigned w = 0; w < workers; w++)
		jobs.push_back({"check the GPU image", [&, w]() -> Status {
					std::vector<uint64_t> buf(index.chunk_bytes / sizeof(uint64_t));
					std::vector<uint8_t> stored;
					ChunkCodec codec;
					StepClock clock(steps[w]);
					for (auto [first, last] = batches.next(); first < last; std::tie(first, last) = batches.next()) {
						for (size_t k = first; k < last && !stop.load(std::memory_order_relaxed);) {
							if (cancel && cancel->load(std::memory_order_relaxed)) {
								stop = true;
								return make_error(ECANCELED, "%s", "the check of the GPU image was cancelled");
							}
							std::optional<size_t> urgent = next_wanted();
							size_t i = urgent ? *urgent : k++;
							if (!urgent && taken[i].exchange(true))
								continue;
							const Piece &p = pieces[i];
							const GpuLoadTarget &t = targets[p.target];
							Status st = load_chunk(host, index, readers, t, p, buf, stored, codec, clock);
							if (!st && !t.pid) {
								stop = true;
								return std::move(st).error().context("process %d of the image", t.ns_pid);
							}
							if (!st) {
								stop = true;
								return std::move(st).error().context("restore pid %d (pid %d in the image)", t.pid,
												     t.ns_pid);
							}
							if (lazy && p.decoded)
								lazy->decoded(t.ns_pid, p.addr);
							done.fetch_add(p.len, std::memory_order_relaxed);
						}
					}
					return {};
				}});
	std::vector<Status> results = run_jobs(
		std::move(jobs), 0, 0,
		progress_watch(index.criu_pages ? "GPU state checked" : "GPU image read back", done, total));
	for (Status &st : results)
		if (!st)
			return std::move(st).error();
	StepTimes sum;
	for (const StepTimes &s : steps)
		sum += s;
	log_steps(index.criu_pages ? "GPU state check" : "GPU image read back", workers, now_us() - t0, sum,
		  "decode and check");
	return {};
}

} // namespace cuda_criu
