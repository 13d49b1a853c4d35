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
#include <tuple>
#include <unordered_map>

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
constexpr uint32_t kCriuMmMagic = 0x57492820;        // MM_MAGIC: mm-N.img
constexpr uint64_t kFdTypeReg = 1;                   // FileEntry.type REG (images/fdinfo.proto)
// PagemapEntry.flags (criu/include/pagemap.h)
constexpr uint32_t kPeParent = 1 << 0;  // the pages are in the parent image (an incremental dump)
constexpr uint32_t kPeLazy = 1 << 1;    // lazy migration serves them
constexpr uint32_t kPePresent = 1 << 2; // they are in pages-<pages_id>.img, entry after entry
// VmaEntry.status (criu/include/image.h)
constexpr uint32_t kVmaAreaRegular = 1 << 0; // an area CRIU dumps and restores
constexpr uint32_t kVmaFilePrivate = 1 << 6; // MAP_PRIVATE of a file: the restorer writes its pages over the file's
// Mapped from something else than a file of files.img, or their pages restored otherwise:
constexpr uint32_t kVmaAreaSysvipc = 1 << 10;
constexpr uint32_t kVmaAreaSocket = 1 << 11;
constexpr uint32_t kVmaAreaAioring = 1 << 13;
constexpr uint32_t kVmaAreaMemfd = 1 << 14;
constexpr uint32_t kVmaExtPlugin = 1 << 27;

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

// CRIU's two magic words: the common one, then the image's own (what names its kind in errors).
Status check_criu_magic(const uint8_t *data, size_t size, uint32_t magic, const char *kind)
{
	if (size < 8)
		return make_error(EINVAL, "cut short: %zu bytes, fewer than CRIU's two magic words", size);
	if (le32(data) != kCriuCommonMagic || le32(data + 4) != magic)
		return make_error(EINVAL, "not a CRIU %s image (magic %08x %08x)", kind, le32(data), le32(data + 4));
	return {};
}

} // namespace

Result<CriuPagemap> decode_criu_pagemap(const uint8_t *data, size_t size, uint64_t page_size)
{
	if (Status st = check_criu_magic(data, size, kCriuPagemapMagic, "pagemap"); !st)
		return std::move(st).error();
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
	if (Status st = check_criu_magic(data, size, kCriuFilesMagic, "files"); !st)
		return std::move(st).error();
	std::vector<CriuRegFile> files;
	Status parsed = for_each_criu_message(data, size, 8, [&](size_t, WireReader r) -> Status {
		uint64_t type = 0;
		uint32_t id = 0;
		std::optional<WireField> reg;
		Status st = for_each_field(r, [&](const WireField &f) -> Status {
			if (f.number == 1 && f.type == 0)
				type = f.varint;
			else if (f.number == 2 && f.type == 0)
				id = static_cast<uint32_t>(f.varint); // a uint32
			else if (f.number == 3 && f.type == 2)
				reg = f;
			return {};
		});
		if (!st || type != kFdTypeReg || !reg)
			return st;
		CriuRegFile file;
		file.id = id;
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

namespace {

// One VmaEntry: the private file mapping it is, or nullopt for any other.
Result<std::optional<CriuFileVma>> decode_private_file_vma(const uint8_t *data, size_t size)
{
	uint64_t start = 0, end = 0, pgoff = 0, shmid = 0;
	uint32_t status = 0;
	unsigned seen = 0; // bit n: field n
	Status st = for_each_field(WireReader(data, size), [&](const WireField &f) -> Status {
		if (f.number > 7)
			return {}; // fd, madv, fdflags; or of a newer CRIU
		if (f.type != 0)
			return make_error(EINVAL, "field %u of wire type %u", f.number, f.type);
		seen |= 1u << f.number;
		if (f.number == 1)
			start = f.varint;
		else if (f.number == 2)
			end = f.varint;
		else if (f.number == 3)
			pgoff = f.varint;
		else if (f.number == 4)
			shmid = f.varint;
		else if (f.number == 7)
			status = static_cast<uint32_t>(f.varint); // a uint32
		return {};
	});
	if (!st)
		return std::move(st).error();
	constexpr unsigned kNeeded = 1 << 1 | 1 << 2 | 1 << 3 | 1 << 4 | 1 << 7;
	if ((seen & kNeeded) != kNeeded)
		return make_error(EINVAL, "no start, end, pgoff, shmid or status");
	if (end <= start)
		return make_error(EINVAL, "%#" PRIx64 "-%#" PRIx64 ": it does not end past its start", start, end);
	constexpr uint32_t kOther = kVmaAreaSysvipc | kVmaAreaSocket | kVmaAreaAioring | kVmaAreaMemfd | kVmaExtPlugin;
	if ((status & (kVmaAreaRegular | kVmaFilePrivate)) != (kVmaAreaRegular | kVmaFilePrivate) || (status & kOther))
		return std::optional<CriuFileVma>();
	// Only a file mapping's pgoff and shmid are its file's: another mapping's may be anything.
	if (pgoff > UINT64_MAX - (end - start))
		return make_error(EINVAL, "%#" PRIx64 "-%#" PRIx64 ": file offset %" PRIu64 " past 2^64 bytes", start, end,
				  pgoff);
	if (shmid > UINT32_MAX)
		return make_error(EINVAL, "%#" PRIx64 "-%#" PRIx64 ": file id %" PRIu64 ", past any files.img id", start,
				  end, shmid);
	return std::optional<CriuFileVma>(CriuFileVma{start, end, pgoff, static_cast<uint32_t>(shmid)});
}

// The pid of "mm-N.img"; empty for any other name.
std::string_view mm_image_pid(std::string_view name)
{
	if (!name.starts_with("mm-") || !name.ends_with(".img"))
		return {};
	std::string_view pid = name.substr(3, name.size() - 7);
	if (pid.empty() || !std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; }))
		return {};
	return pid;
}

// The VMAs of one task, sorted; overlapping ones, which no kernel makes, are an error (they would multiply
// the ranges).
Result<std::vector<CriuFileVma>> task_private_file_vmas(int dir_fd, const std::string &name)
{
	auto data = read_image_file(dir_fd, name.c_str(), kCriuImageMaxBytes);
	if (!data)
		return std::move(data).error();
	if (!*data)
		return std::vector<CriuFileVma>(); // gone since the directory was listed
	auto vmas = decode_criu_private_file_vmas((*data)->data(), (*data)->size());
	if (!vmas)
		return std::move(vmas).error().context("%s", name.c_str());
	std::sort(vmas->begin(), vmas->end(), [](const CriuFileVma &a, const CriuFileVma &b) { return a.start < b.start; });
	for (size_t i = 1; i < vmas->size(); i++)
		if ((*vmas)[i].start < (*vmas)[i - 1].end)
			return make_error(EINVAL, "%s: the VMAs at %#" PRIx64 " and %#" PRIx64 " overlap", name.c_str(),
					  (*vmas)[i - 1].start, (*vmas)[i].start);
	return vmas;
}

// The present runs of one task's pagemap, sorted by address; none where the task has no pagemap.
Result<std::vector<PagemapRun>> task_present_runs(int dir_fd, const std::string &name, uint64_t page_size)
{
	auto data = read_image_file(dir_fd, name.c_str(), kCriuImageMaxBytes);
	if (!data)
		return std::move(data).error();
	if (!*data)
		return std::vector<PagemapRun>();
	auto map = decode_criu_pagemap((*data)->data(), (*data)->size(), page_size);
	if (!map)
		return std::move(map).error().context("%s", name.c_str());
	std::vector<PagemapRun> runs = std::move(map->present);
	std::sort(runs.begin(), runs.end(), [](const PagemapRun &a, const PagemapRun &b) { return a.vaddr < b.vaddr; });
	for (size_t i = 0; i < runs.size(); i++) {
		if (runs[i].bytes > UINT64_MAX - runs[i].vaddr)
			return make_error(EINVAL, "%s: the entry at %#" PRIx64 " ends past 2^64", name.c_str(), runs[i].vaddr);
		if (i && runs[i].vaddr < runs[i - 1].vaddr + runs[i - 1].bytes)
			return make_error(EINVAL, "%s: the entries at %#" PRIx64 " and %#" PRIx64 " overlap", name.c_str(),
					  runs[i - 1].vaddr, runs[i].vaddr);
	}
	return runs;
}

} // namespace

Result<std::vector<CriuFileVma>> decode_criu_private_file_vmas(const uint8_t *data, size_t size)
{
	if (Status st = check_criu_magic(data, size, kCriuMmMagic, "mm"); !st)
		return std::move(st).error();
	std::vector<CriuFileVma> vmas;
	size_t messages = 0;
	Status parsed = for_each_criu_message(data, size, 8, [&](size_t, WireReader r) -> Status {
		if (messages++)
			return make_error(EINVAL, "a second MmEntry");
		size_t index = 0;
		return for_each_field(r, [&](const WireField &f) -> Status {
			if (f.number != 14)
				return {};
			if (f.type != 2)
				return make_error(EINVAL, "MmEntry field 14 (vmas) of wire type %u", f.type);
			auto vma = decode_private_file_vma(f.bytes, f.len);
			if (!vma)
				return std::move(vma).error().context("VmaEntry %zu", index);
			index++;
			if (*vma)
				vmas.push_back(**vma);
			return {};
		});
	});
	return parsed_value(std::move(parsed), messages > 0, "MmEntry after the magic words", std::move(vmas));
}

Result<std::vector<FileRange>> cow_file_ranges(int dir_fd, uint64_t page_size)
{
	auto files = criu_reg_files(dir_fd);
	if (!files)
		return std::move(files).error();
	if (files->empty())
		return std::vector<FileRange>();
	std::unordered_map<uint32_t, const CriuRegFile *> by_id;
	for (const CriuRegFile &f : *files)
		by_id.emplace(f.id, &f);
	// A new open file description: a duplicate of dir_fd would share its offset with CRIU's descriptor.
	auto d = Dir::open(".", dir_fd);
	if (!d)
		return errno_error("read the image directory");
	std::vector<std::string> pids;
	while (const char *name = d->next())
		if (std::string_view pid = mm_image_pid(name); !pid.empty())
			pids.emplace_back(pid);
	std::sort(pids.begin(), pids.end());
	std::vector<FileRange> ranges;
	for (const std::string &pid : pids) {
		auto vmas = task_private_file_vmas(dir_fd, format("mm-%s.img", pid.c_str()));
		if (!vmas)
			return std::move(vmas).error();
		if (vmas->empty())
			continue;
		auto runs = task_present_runs(dir_fd, format("pagemap-%s.img", pid.c_str()), page_size);
		if (!runs)
			return std::move(runs).error();
		// Both sorted, neither overlapping itself: one pass over each.
		size_t v = 0;
		for (const PagemapRun &r : *runs) {
			const uint64_t r_end = r.vaddr + r.bytes;
			while (v < vmas->size() && (*vmas)[v].end <= r.vaddr)
				v++;
			for (size_t w = v; w < vmas->size() && (*vmas)[w].start < r_end; w++) {
				const CriuFileVma &m = (*vmas)[w];
				auto file = by_id.find(m.file_id);
				uint64_t a = std::max(r.vaddr, m.start), b = std::min(r_end, m.end);
				if (file != by_id.end() && a < b)
					ranges.push_back({file->second->name, file->second->size, m.pgoff + (a - m.start), b - a});
			}
		}
	}
	// Tasks share their libraries (and a file has one id per open): one file's ranges merged, whatever
	// their ids.
	std::sort(ranges.begin(), ranges.end(), [](const FileRange &a, const FileRange &b) {
		return std::tie(a.name, a.size, a.offset) < std::tie(b.name, b.size, b.offset);
	});
	std::vector<FileRange> merged;
	for (FileRange &r : ranges) {
		if (!merged.empty()) {
			FileRange &last = merged.back();
			if (last.name == r.name && last.size == r.size && r.offset <= last.offset + last.len) {
				last.len = std::max(last.offset + last.len, r.offset + r.len) - last.offset;
				continue;
			}
		}
		merged.push_back(std::move(r));
	}
	return merged;
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

namespace {

// A file a task of the image maps, by its absolute path on a local file system, if it is the one CRIU
// recorded (its size, where recorded); invalid otherwise: left to CRIU.
UniqueFd open_recorded_file(const std::string &name, std::optional<uint64_t> recorded, const LocalMounts &local,
			    uint64_t &size)
{
	if (name.empty() || name[0] != '/')
		return {};
	UniqueFd fd = open_regular_file(name.c_str(), local, &size);
	if (recorded && *recorded != size)
		return {};
	return fd;
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
			uint64_t size = 0;
			UniqueFd fd = open_recorded_file(files[i].name, files[i].size, local, size);
			if (!fd.valid())
				continue;
			bytes += read_into_cache(fd.get(), 0, std::min(size, kHeadAheadBytes), buf, stop);
			read++;
		}
	});
	return {read, bytes};
}

ReadAhead read_ranges_ahead(const std::vector<FileRange> &ranges, unsigned threads, const std::atomic<bool> *stop)
{
	// One file's ranges follow one another (cow_file_ranges): a file at a time, opened once.
	std::vector<size_t> firsts; // where each file's ranges begin, then ranges.size()
	for (size_t i = 0; i < ranges.size(); i++)
		if (i == 0 || ranges[i].name != ranges[i - 1].name || ranges[i].size != ranges[i - 1].size)
			firsts.push_back(i);
	const size_t n_files = firsts.size();
	firsts.push_back(ranges.size());
	const LocalMounts local;
	std::atomic<size_t> next{0}, read{0};
	std::atomic<uint64_t> bytes{0}, budget{kRangesAheadBudget};
	// Taken before it is read, up to what is left: the threads together never ask for more than the budget.
	auto take = [&budget](uint64_t want) {
		uint64_t left = budget.load();
		while (left && !budget.compare_exchange_weak(left, left - std::min(left, want))) {
		}
		return std::min(left, want);
	};
	on_threads(static_cast<unsigned>(std::min<size_t>(threads, n_files)), [&] {
		std::vector<uint8_t> buf(kHeadAheadBytes);
		for (size_t i; (i = next.fetch_add(1)) < n_files && budget > 0 && !(stop && *stop);) {
			uint64_t size = 0;
			UniqueFd fd = open_recorded_file(ranges[firsts[i]].name, ranges[firsts[i]].size, local, size);
			if (!fd.valid())
				continue;
			read++;
			for (size_t r = firsts[i]; r < firsts[i + 1] && !(stop && *stop); r++) {
				uint64_t len = ranges[r].len ? take(ranges[r].len) : 0;
				if (ranges[r].len && !len)
					break; // the budget is spent
				bytes += read_into_cache(fd.get(), ranges[r].offset, len, buf, stop);
			}
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
