#include "elf_file.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <string_view>

#include "os/unique_fd.h"

namespace cuda_criu::cli {
namespace {

// A whole file mapped read-only; unmapped on destruction.
class MappedFile {
public:
	static Result<MappedFile> open(const std::string &path)
	{
		UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
		if (!fd.valid())
			return errno_error("open %s", path.c_str());
		struct stat st;
		if (fstat(fd.get(), &st) != 0)
			return errno_error("stat %s", path.c_str());
		if (!S_ISREG(st.st_mode))
			return make_error(EINVAL, "%s is not a regular file", path.c_str());
		size_t size = static_cast<size_t>(st.st_size);
		if (size == 0)
			return MappedFile(nullptr, 0);
		void *p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
		if (p == MAP_FAILED)
			return errno_error("mmap %s", path.c_str());
		return MappedFile(static_cast<const unsigned char *>(p), size);
	}

	MappedFile(MappedFile &&other) noexcept : data_(other.data_), size_(other.size_)
	{
		other.data_ = nullptr;
		other.size_ = 0;
	}
	MappedFile &operator=(MappedFile &&) = delete;
	MappedFile(const MappedFile &) = delete;
	~MappedFile()
	{
		if (data_)
			munmap(const_cast<unsigned char *>(data_), size_);
	}

	const unsigned char *data() const { return data_; }
	size_t size() const { return size_; }
	// Whether [offset, offset + length) lies inside the file (without overflowing).
	bool holds(uint64_t offset, uint64_t length) const { return offset <= size_ && length <= size_ - offset; }

private:
	MappedFile(const unsigned char *data, size_t size) : data_(data), size_(size) {}
	const unsigned char *data_;
	size_t size_;
};

} // namespace

Result<bool> elf_defines_dynamic_symbol(const std::string &path, const std::string &symbol)
{
	auto file = MappedFile::open(path);
	if (!file)
		return std::move(file).error();
	const MappedFile &f = *file;
	if (!f.holds(0, sizeof(Elf64_Ehdr)) || std::memcmp(f.data(), ELFMAG, SELFMAG) != 0)
		return make_error(ENOEXEC, "%s is not an ELF file", path.c_str());
	if (f.data()[EI_CLASS] != ELFCLASS64 || f.data()[EI_DATA] != ELFDATA2LSB)
		return make_error(ENOEXEC, "%s is not a 64-bit little-endian ELF file", path.c_str());
	Elf64_Ehdr eh;
	std::memcpy(&eh, f.data(), sizeof(eh));
	if (eh.e_shentsize != sizeof(Elf64_Shdr) || !f.holds(eh.e_shoff, uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr)))
		return make_error(ENOEXEC, "%s: section headers missing or out of bounds", path.c_str());
	auto section = [&](size_t i) {
		Elf64_Shdr sh;
		std::memcpy(&sh, f.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(sh));
		return sh;
	};
	for (size_t i = 0; i < eh.e_shnum; i++) {
		Elf64_Shdr dynsym = section(i);
		if (dynsym.sh_type != SHT_DYNSYM)
			continue;
		if (dynsym.sh_entsize != sizeof(Elf64_Sym) || dynsym.sh_link >= eh.e_shnum ||
		    !f.holds(dynsym.sh_offset, dynsym.sh_size))
			return make_error(ENOEXEC, "%s: malformed .dynsym section", path.c_str());
		Elf64_Shdr strtab = section(dynsym.sh_link);
		if (strtab.sh_type != SHT_STRTAB || !f.holds(strtab.sh_offset, strtab.sh_size))
			return make_error(ENOEXEC, "%s: malformed dynamic string table", path.c_str());
		const char *names = reinterpret_cast<const char *>(f.data() + strtab.sh_offset);
		for (uint64_t k = 0; k < dynsym.sh_size / sizeof(Elf64_Sym); k++) {
			Elf64_Sym sym;
			std::memcpy(&sym, f.data() + dynsym.sh_offset + k * sizeof(Elf64_Sym), sizeof(sym));
			if (sym.st_shndx == SHN_UNDEF || sym.st_name >= strtab.sh_size)
				continue;
			// Names are NUL-terminated inside the table; a name running off its end does not match.
			std::string_view name(names + sym.st_name, strnlen(names + sym.st_name, strtab.sh_size - sym.st_name));
			if (name == symbol && sym.st_name + name.size() < strtab.sh_size)
				return true;
		}
		return false;
	}
	return false; // statically linked: no dynamic symbols at all
}

Result<bool> file_contains(const std::string &path, const std::string &needle)
{
	auto file = MappedFile::open(path);
	if (!file)
		return std::move(file).error();
	if (needle.empty())
		return true;
	return file->size() > 0 && memmem(file->data(), file->size(), needle.data(), needle.size()) != nullptr;
}

} // namespace cuda_criu::cli
