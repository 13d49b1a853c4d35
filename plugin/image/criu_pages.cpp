#include "image/criu_pages.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "base/format.h"
#include "image/image_file.h"
#include "os/dir.h"
#include "os/file_pages.h"
#include "os/fs_context.h"
#include "os/unique_fd.h"

namespace cuda_criu {
namespace {

constexpr uint32_t kCriuCommonMagic = 0x54564319;    // IMG_COMMON_MAGIC, the first word of most images
constexpr uint32_t kCriuPagemapMagic = 0x56084025;   // PAGEMAP_MAGIC (and SHMEM_PAGEMAP_MAGIC)
constexpr uint32_t kCriuInventoryMagic = 0x58313116; // INVENTORY_MAGIC: the inventory's only magic word
constexpr uint32_t kCriuFilesMagic = 0x56303138;     // FILES_MAGIC: files.img
constexpr uint64_t kFdTypeReg = 1;                   // FileEntry.type REG (images/fdinfo.proto)
// PagemapEntry.flags (criu/include/pagemap.h)
constexpr uint32_t kPeParent = 1 << 0;  // the pages are in the parent image (an incremental dump)
constexpr uint32_t kPeLazy = 1 << 1;    // lazy migration serves them
constexpr uint32_t kPePresent = 1 << 2; // they are in pages-<pages_id>.img, entry after entry

// CRIU writes its numbers in the host's byte order; the images of an x86-64 or arm64 host are
// little-endian, as is every machine this plugin runs on.
uint32_t le32(const uint8_t *p)
{
	return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// One field of a protobuf message: a varint's value, or a length-delimited field's bytes.
struct WireField {
	uint32_t number = 0;
	unsigned type = 0; // 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit
	uint64_t varint = 0;
	const uint8_t *bytes = nullptr;
	size_t len = 0;
};

// The fields of one message in order; nothing is read past its end.
class WireReader {
public:
	WireReader(const uint8_t *data, size_t size) : p_(data), end_(data + size) {}

	// false at the end of the message; an error when it is malformed.
	Result<bool> next(WireField &f)
	{
		if (p_ == end_)
			return false;
		uint64_t key = 0;
		if (!varint(key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff)
			return make_error(EINVAL, "a malformed field key");
		f = WireField{static_cast<uint32_t>(key >> 3), static_cast<unsigned>(key & 7)};
		size_t skip = 0;
		switch (f.type) {
		case 0:
			if (!varint(f.varint))
				return make_error(EINVAL, "field %u: a malformed varint", f.number);
			return true;
		case 1:
			skip = 8;
			break;
		case 5:
			skip = 4;
			break;
		case 2: {
			uint64_t len = 0;
			if (!varint(len))
				return make_error(EINVAL, "field %u: a malformed length", f.number);
			if (len > static_cast<uint64_t>(end_ - p_))
				return make_error(EINVAL, "field %u: %" PRIu64 " bytes, past the message's end", f.number, len);
			f.bytes = p_;
			f.len = static_cast<size_t>(len);
			skip = f.len;
			break;
		}
		default: // groups (3, 4) are not in CRIU's images; 6 and 7 do not exist
			return make_error(EINVAL, "field %u: wire type %u", f.number, f.type);
		}
		if (skip > static_cast<size_t>(end_ - p_))
			return make_error(EINVAL, "field %u: past the message's end", f.number);
		p_ += skip;
		return true;
	}

private:
	bool varint(uint64_t &v)
	{
		v = 0;
		for (unsigned shift = 0; shift < 64 && p_ != end_; shift += 7) {
			uint8_t b = *p_++;
			v |= static_cast<uint64_t>(b & 0x7f) << shift;
			if (!(b & 0x80))
				return true;
		}
		return false;
	}

	const uint8_t *p_;
	const uint8_t *end_;
};

// Calls field(f) for each field of the message in r; a malformed message is an error.
template <typename F>
Status for_each_field(WireReader r, F &&field)
{
	WireField f;
	for (;;) {
		auto more = r.next(f);
		if (!more)
			return std::move(more).error();
		if (!*more)
			return {};
		if (Status st = field(f); !st)
			return st;
	}
}

// CRIU's framing after the magic words: each message is preceded by its size in 4 bytes. Calls
// message(offset, reader) for each; errors name the offset in the file.
template <typename F>
Status for_each_criu_message(const uint8_t *data, size_t size, size_t offset, F &&message)
{
	while (offset < size) {
		if (size - offset < 4)
			return make_error(EINVAL, "cut short at offset %zu: %zu byte(s) where a message's 4-byte size belongs",
					  offset, size - offset);
		uint32_t len = le32(data + offset);
		if (len > size - offset - 4)
			return make_error(EINVAL, "cut short at offset %zu: a message of %u bytes, %zu left", offset, len,
					  size - offset - 4);
		if (auto st = message(offset, WireReader(data + offset + 4, len)); !st)
			return std::move(st).error().context("the message at offset %zu", offset);
		offset += 4 + static_cast<size_t>(len);
	}
	return {};
}

// What a parse of a CRIU image gives: its error, "cut short" when the file held no `expected`, or value.
template <typename T>
Result<T> parsed_value(Status parsed, bool found, const char *expected, T value)
{
	if (!parsed)
		return std::move(parsed).error();
	if (!found)
		return make_error(EINVAL, "cut short: no %s", expected);
	return value;
}

} // namespace

Result<CriuPagemap> decode_criu_pagemap(const uint8_t *data, size_t size, uint64_t page_size)
{
	if (size < 8)
		return make_error(EINVAL, "cut short: %zu bytes, fewer than CRIU's two magic words", size);
	if (le32(data) != kCriuCommonMagic || le32(data + 4) != kCriuPagemapMagic)
		return make_error(EINVAL, "not a CRIU pagemap image (magic %08x %08x)", le32(data), le32(data + 4));
	CriuPagemap pm;
	bool head = false;
	Status parsed = for_each_criu_message(data, size, 8, [&](size_t offset, WireReader r) -> Status {
		if (!head) {
			bool has_id = false;
			Status st = for_each_field(r, [&](const WireField &f) -> Status {
				if (f.number == 1 && f.type == 0) {
					pm.pages_id = static_cast<uint32_t>(f.varint);
					has_id = true;
				}
				return {};
			});
			if (!st)
				return st;
			if (!has_id)
				return make_error(EINVAL, "a PagemapHead without pages_id");
			head = true;
			return {};
		}
		uint64_t vaddr = 0, compat_nr = 0, nr = 0;
		uint32_t flags = 0;
		bool has_vaddr = false, has_compat = false, has_flags = false, has_nr = false, in_parent = false;
		Status st = for_each_field(r, [&](const WireField &f) -> Status {
			if (f.number <= 5 && f.type != 0)
				return make_error(EINVAL, "PagemapEntry field %u of wire type %u", f.number, f.type);
			if (f.number == 1) {
				vaddr = f.varint;
				has_vaddr = true;
			} else if (f.number == 2) {
				compat_nr = f.varint & 0xffffffff; // a uint32
				has_compat = true;
			} else if (f.number == 3) {
				in_parent = f.varint != 0;
			} else if (f.number == 4) {
				flags = static_cast<uint32_t>(f.varint);
				has_flags = true;
			} else if (f.number == 5) {
				nr = f.varint;
				has_nr = true;
			} // other fields: of a newer CRIU
			return {};
		});
		if (!st)
			return st;
		if (!has_vaddr || !has_compat)
			return make_error(EINVAL, "a PagemapEntry without vaddr or nr_pages");
		if (in_parent)
			flags |= kPeParent;
		else if (!has_flags)
			flags = kPePresent;
		if (!has_nr)
			nr = compat_nr;
		if (nr > UINT64_MAX / page_size)
			return make_error(EINVAL, "a PagemapEntry of %" PRIu64 " pages", nr);
		uint64_t bytes = nr * page_size;
		pm.entries++;
		if (flags & kPePresent) {
			if (pm.present_bytes + bytes < pm.present_bytes)
				return make_error(EINVAL, "the entries declare more than 2^64 bytes");
			pm.present.push_back({vaddr, bytes, pm.present_bytes, offset});
			pm.present_bytes += bytes;
		} else if (flags & kPeParent) {
			pm.parent_bytes += bytes;
		} else if (flags & kPeLazy) {
			pm.lazy_bytes += bytes;
		} else { // CRIU would read such pages from the pages image all the same, from the wrong offset
			return make_error(EINVAL, "a PagemapEntry at %#" PRIx64 " with flags %#x: neither present, in the "
						  "parent nor lazy", vaddr, flags);
		}
		return {};
	});
	return parsed_value(std::move(parsed), head, "PagemapHead after the magic words", std::move(pm));
}

Result<std::vector<CriuRegFile>> decode_criu_reg_files(const uint8_t *data, size_t size)
{
	if (size < 8)
		return make_error(EINVAL, "cut short: %zu bytes, fewer than CRIU's two magic words", size);
	if (le32(data) != kCriuCommonMagic || le32(data + 4) != kCriuFilesMagic)
		return make_error(EINVAL, "not a CRIU files image (magic %08x %08x)", le32(data), le32(data + 4));
	std::vector<CriuRegFile> files;
	Status parsed = for_each_criu_message(data, size, 8, [&](size_t, WireReader r) -> Status {
		uint64_t type = 0;
		std::optional<WireField> reg;
		Status st = for_each_field(r, [&](const WireField &f) -> Status {
			if (f.number == 1 && f.type == 0)
				type = f.varint;
			else if (f.number == 3 && f.type == 2)
				reg = f;
			return {};
		});
		if (!st || type != kFdTypeReg || !reg)
			return st;
		CriuRegFile file;
		bool named = false;
		st = for_each_field(WireReader(reg->bytes, reg->len), [&](const WireField &f) -> Status {
			if (f.number == 6 && f.type == 2) {
				file.name.assign(reinterpret_cast<const char *>(f.bytes), f.len);
				named = true;
			} else if (f.number == 8 && f.type == 0) {
				file.size = f.varint;
			}
			return {};
		});
		if (st && named)
			files.push_back(std::move(file));
		return st;
	});
	if (!parsed)
		return std::move(parsed).error();
	return files;
}

Result<std::vector<CriuRegFile>> criu_reg_files(int dir_fd)
{
	auto data = read_image_file(dir_fd, "files.img", kCriuImageMaxBytes);
	if (!data)
		return std::move(data).error();
	if (!*data)
		return std::vector<CriuRegFile>();
	auto files = decode_criu_reg_files((*data)->data(), (*data)->size());
	if (!files)
		return std::move(files).error().context("%s", "files.img");
	return files;
}

Result<CriuInventory> decode_criu_inventory(const uint8_t *data, size_t size)
{
	if (size < 4)
		return make_error(EINVAL, "cut short: %zu bytes, fewer than CRIU's magic word", size);
	if (le32(data) != kCriuInventoryMagic)
		return make_error(EINVAL, "not a CRIU inventory (magic %08x)", le32(data));
	CriuInventory inv;
	size_t messages = 0;
	Status parsed = for_each_criu_message(data, size, 4, [&](size_t, WireReader r) -> Status {
		if (messages++)
			return make_error(EINVAL, "a second InventoryEntry");
		return for_each_field(r, [&](const WireField &f) -> Status {
			if (f.number == 1 && f.type == 0)
				inv.img_version = static_cast<uint32_t>(f.varint);
			if (f.number != 12 || f.type != 2)
				return {};
			Status st = for_each_field(WireReader(f.bytes, f.len), [&](const WireField &p) -> Status {
				if (p.number == 12 && p.type == 2)
					inv.plugins.emplace_back(reinterpret_cast<const char *>(p.bytes), p.len);
				return {};
			});
			if (!st)
				return std::move(st).error().context("%s", "plugins_entry");
			return {};
		});
	});
	return parsed_value(std::move(parsed), messages > 0, "InventoryEntry after the magic word", std::move(inv));
}

bool is_pagemap_name(const std::string &name)
{
	std::string_view s = name;
	if (!s.starts_with("pagemap-") || !s.ends_with(".img"))
		return false;
	s = s.substr(8, s.size() - 12);
	if (s.starts_with("shmem-"))
		s.remove_prefix(6);
	return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Result<std::vector<std::string>> pagemap_names(int dir_fd)
{
	// A new open file description: a duplicate of dir_fd would share its offset with CRIU's descriptor.
	auto d = Dir::open(".", dir_fd);
	if (!d)
		return errno_error("read the image directory");
	std::vector<std::string> names;
	while (const char *name = d->next())
		if (is_pagemap_name(name))
			names.emplace_back(name);
	std::sort(names.begin(), names.end());
	return names;
}

Status read_criu_memory(const PagemapFiles &files, int pages_fd, uint64_t addr, void *buf, size_t len)
{
	auto *out = static_cast<uint8_t *>(buf);
	std::fill(out, out + len, 0);
	uint64_t end = addr + len;
	for (const PagemapRun &r : files.map.present) {
		uint64_t from = std::max(addr, r.vaddr), to = std::min(end, r.vaddr + r.bytes);
		for (uint64_t at = from; at < to;) {
			uint64_t off = r.pages_offset + (at - r.vaddr);
			ssize_t n = pread(pages_fd, out + (at - addr), to - at, static_cast<off_t>(off));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return n < 0 ? errno_error("read %s at offset %llu", files.pages.c_str(),
							   static_cast<unsigned long long>(off))
					     : make_error(EIO, "%s ends before offset %llu", files.pages.c_str(),
							  static_cast<unsigned long long>(off));
			at += static_cast<uint64_t>(n);
		}
	}
	return {};
}

const PagemapRun *PagemapFiles::first_run_cut_off() const
{
	auto run = std::find_if(map.present.begin(), map.present.end(),
				[&](const PagemapRun &r) { return r.pages_offset + r.bytes > pages_size; });
	return run == map.present.end() ? nullptr : &*run;
}

Result<PagemapFiles> read_pagemap_files(int dir_fd, const std::string &name, uint64_t page_size)
{
	auto data = read_image_file(dir_fd, name.c_str(), kCriuImageMaxBytes);
	if (!data)
		return std::move(data).error();
	if (!*data)
		return make_error(ENOENT, "%s vanished while being read", name.c_str());
	auto map = decode_criu_pagemap((*data)->data(), (*data)->size(), page_size);
	if (!map)
		return std::move(map).error();
	PagemapFiles f;
	f.pagemap = name;
	f.pagemap_bytes = (*data)->size();
	f.map = std::move(*map);
	f.pages = format("pages-%u.img", f.map.pages_id);
	struct stat st;
	if (fstatat(dir_fd, f.pages.c_str(), &st, 0) != 0) {
		f.pages_errno = errno;
		return f;
	}
	f.pages_regular = S_ISREG(st.st_mode);
	f.pages_size = static_cast<uint64_t>(st.st_size);
	return f;
}

Result<PagesCheck> check_pages_files(int dir_fd, uint64_t page_size)
{
	PagesCheck check;
	auto names = pagemap_names(dir_fd);
	if (!names) {
		check.unchecked.push_back(names.error().message());
		return check;
	}
	for (const std::string &name : *names) {
		auto f = read_pagemap_files(dir_fd, name, page_size);
		if (!f) {
			std::string why = f.error().message();
			if (!why.starts_with(name))
				why = format("%s: %s", name.c_str(), why.c_str());
			check.unchecked.push_back(std::move(why));
			continue;
		}
		const uint64_t want = f->map.present_bytes;
		if (f->pages_errno == ENOENT && want)
			return make_error(ENOENT,
					  "%s is missing: the image's pagemap declares %" PRIu64 " bytes in it (the image was "
					  "copied incompletely: copy it again)",
					  f->pages.c_str(), want);
		if (f->pages_errno && want)
			return make_error(f->pages_errno, "%s (the image's pagemap declares %" PRIu64 " bytes in it): %s",
					  f->pages.c_str(), want, errno_string(f->pages_errno).c_str());
		if (f->pages_errno == 0 && !f->pages_regular && want)
			return make_error(EINVAL, "%s is not a regular file", f->pages.c_str());
		if (f->pages_errno == 0 && f->pages_size < want)
			return make_error(EIO,
					  "%s is cut short: %" PRIu64 " bytes, the image's pagemap declares %" PRIu64
					  " (the image was copied incompletely: copy it again)",
					  f->pages.c_str(), f->pages_size, want);
		check.pagemaps++;
		check.bytes += want;
		if (want)
			check.pages.push_back(f->pages);
	}
	return check;
}

namespace {

// Runs work on `threads` threads at once (this one among them) and waits for all.
void on_threads(unsigned threads, const std::function<void()> &work)
{
	std::vector<std::thread> pool;
	for (unsigned t = 1; t < std::max(1u, threads); t++)
		pool.push_back(own_thread(work));
	work();
	for (std::thread &t : pool)
		t.join();
}

} // namespace

ReadAhead read_heads_ahead(const std::vector<CriuRegFile> &files, unsigned threads, const std::atomic<bool> *stop)
{
	const LocalMounts local;
	std::atomic<size_t> next{0}, read{0};
	std::atomic<uint64_t> bytes{0};
	on_threads(threads, [&] {
		std::vector<uint8_t> buf(kHeadAheadBytes);
		for (size_t i; (i = next.fetch_add(1)) < std::min(files.size(), kMaxHeadsAhead) && bytes < kHeadsAheadBudget &&
			       !(stop && *stop);) {
			const CriuRegFile &f = files[i];
			if (f.name.empty() || f.name[0] != '/')
				continue;
			uint64_t size = 0;
			UniqueFd fd = open_regular_file(f.name.c_str(), local, &size);
			if (!fd.valid() || (f.size && *f.size != size))
				continue;
			bytes += read_into_cache(fd.get(), 0, std::min(size, kHeadAheadBytes), buf, stop);
			read++;
		}
	});
	return {read, bytes};
}

ReadAhead read_ahead(int dir_fd, const std::vector<std::string> &names, unsigned threads, const std::atomic<bool> *stop)
{
	constexpr uint64_t kPiece = 2 << 20;
	struct Piece {
		int fd;
		uint64_t offset, len;
	};
	std::vector<UniqueFd> fds;
	std::vector<Piece> pieces;
	for (const std::string &name : names) {
		UniqueFd fd(openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC)); // as CRIU opens it
		struct stat st {};
		if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		for (uint64_t at = 0; at < static_cast<uint64_t>(st.st_size); at += kPiece)
			pieces.push_back({fd.get(), at, std::min(kPiece, static_cast<uint64_t>(st.st_size) - at)});
		fds.push_back(std::move(fd));
	}
	std::atomic<size_t> next{0};
	std::atomic<uint64_t> bytes{0};
	on_threads(static_cast<unsigned>(std::min<size_t>(threads, pieces.size())), [&] {
		std::vector<uint8_t> buf(kPiece);
		for (size_t i; (i = next.fetch_add(1)) < pieces.size() && !(stop && *stop);)
			bytes += read_into_cache(pieces[i].fd, pieces[i].offset, pieces[i].len, buf, stop);
	});
	return {fds.size(), bytes};
}

} // namespace cuda_criu
