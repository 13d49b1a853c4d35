// Decoded GPU state served on demand: a "process" (a thread of the test) reads memory mapped privately
// from a memory file and registered with a userfaultfd, as CRIU's restorer leaves it (criu-patches/0010),
// while the "decode" fills the file in another order.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "core/lazy_decoded.h"
#include "os/userfault.h"

namespace cuda_criu {
namespace {

constexpr size_t kChunk = 64 << 10;
constexpr size_t kChunks = 16;
constexpr pid_t kPid = 7;

struct Registered {
	int file = -1;
	uint8_t *fill = nullptr;    // the plugin's shared mapping
	uint8_t *process = nullptr; // the process's private one, registered
	UniqueFd uffd;
	std::vector<MemoryRange> chunks;

	Registered()
	{
		file = memfd_create("lazy-decoded-test", MFD_CLOEXEC);
		EXPECT_EQ(ftruncate(file, kChunk * kChunks), 0);
		fill = static_cast<uint8_t *>(mmap(nullptr, kChunk * kChunks, PROT_READ | PROT_WRITE, MAP_SHARED, file, 0));
		process = static_cast<uint8_t *>(mmap(nullptr, kChunk * kChunks, PROT_READ | PROT_WRITE, MAP_PRIVATE, file, 0));
		auto fd = userfault_register_own(reinterpret_cast<uint64_t>(process), kChunk * kChunks);
		if (fd)
			uffd = std::move(*fd);
		for (size_t i = 0; i < kChunks; i++)
			chunks.push_back({addr(i), addr(i) + kChunk});
	}
	~Registered()
	{
		munmap(fill, kChunk * kChunks);
		munmap(process, kChunk * kChunks);
		close(file);
	}
	uint64_t addr(size_t i) const { return reinterpret_cast<uint64_t>(process) + i * kChunk; }
	// The decode of chunk i: its bytes, then the news.
	void decode(LazyDecoded &lazy, size_t i)
	{
		memset(fill + i * kChunk, static_cast<int>(i + 1), kChunk);
		lazy.decoded(kPid, addr(i));
	}
	// What the process reads: the first byte of each page, which must be its chunk's.
	size_t wrong_pages() const
	{
		size_t wrong = 0;
		for (size_t off = 0; off < kChunk * kChunks; off += 4096)
			wrong += process[off] != static_cast<uint8_t>(off / kChunk + 1);
		return wrong;
	}
};

#define REGISTER_OR_SKIP(r)                                                                                            \
	Registered r;                                                                                                  \
	if (!r.uffd.valid())                                                                                           \
		GTEST_SKIP() << "no userfaultfd with minor faults on shared memory here";

TEST(LazyDecoded, ATouchedChunkIsDecodedNextAndReadWhole)
{
	REGISTER_OR_SKIP(r);
	LazyDecoded lazy;
	lazy.add(kPid, r.chunks);
	r.decode(lazy, kChunks - 1); // before the attach: mapped by the server's sweep or on its fault
	int uffd = r.uffd.release();
	std::set<pid_t> attached = lazy.attach([&](pid_t ns_pid) { return ns_pid == kPid ? uffd : -ENOENT; });
	EXPECT_EQ(attached, std::set<pid_t>{kPid});
	std::atomic<size_t> wrong{SIZE_MAX};
	std::thread reader([&] { wrong = r.wrong_pages(); }); // ascending, as the driver reads
	// The decode goes in descending order, but takes first what the reader waits for.
	std::vector<bool> done(kChunks);
	done[kChunks - 1] = true;
	size_t wanted_first = 0, served = 0;
	for (size_t left = kChunks - 1; left;) {
		std::optional<size_t> i;
		if (auto w = lazy.wanted()) {
			EXPECT_EQ(w->first, kPid);
			i = (w->second - r.addr(0)) / kChunk;
			wanted_first += *i == 0;
			served++;
		} else {
			usleep(2000);
			for (size_t k = kChunks; k-- > 0 && !i;)
				if (!done[k])
					i = k;
		}
		if (done[*i])
			continue;
		done[*i] = true;
		r.decode(lazy, *i);
		left--;
	}
	reader.join();
	EXPECT_TRUE(lazy.finish());
	EXPECT_EQ(wrong.load(), 0u);
	EXPECT_EQ(wanted_first, 1u) << "the first chunk was not asked for";
	EXPECT_GE(served, 1u);
}

TEST(LazyDecoded, AnAttachAfterTheDecodeEndsTheRegistration)
{
	REGISTER_OR_SKIP(r);
	LazyDecoded lazy;
	lazy.add(kPid, r.chunks);
	for (size_t i = 0; i < kChunks; i++)
		r.decode(lazy, i);
	EXPECT_TRUE(lazy.finish());
	int uffd = r.uffd.release();
	EXPECT_TRUE(lazy.attach([&](pid_t) { return uffd; }).empty());
	EXPECT_EQ(r.wrong_pages(), 0u); // nothing waits: no server, no registration
}

TEST(LazyDecoded, AFailedDecodeWakesTheReader)
{
	REGISTER_OR_SKIP(r);
	LazyDecoded lazy;
	lazy.add(kPid, r.chunks);
	int uffd = r.uffd.release();
	EXPECT_EQ(lazy.attach([&](pid_t) { return uffd; }).size(), 1u);
	std::atomic<size_t> wrong{SIZE_MAX};
	std::thread reader([&] { wrong = r.wrong_pages(); });
	r.decode(lazy, 0);
	usleep(20000);
	EXPECT_EQ(wrong.load(), SIZE_MAX) << "the reader went past a chunk not decoded";
	EXPECT_TRUE(lazy.finish()); // the decode stops here (it failed): every registration ends
	reader.join();
	EXPECT_EQ(wrong.load(), (kChunks - 1) * kChunk / 4096); // the rest reads as zeros
}

// Pages of this process present (mapped) in [addr, addr + len), by /proc/self/pagemap: read without
// touching them, which would wait for ever on a page nobody maps.
size_t present_pages(uint64_t addr, uint64_t len)
{
	UniqueFd pagemap(open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
	size_t present = 0;
	for (uint64_t a = addr; a < addr + len; a += 4096) {
		uint64_t entry = 0;
		if (pread(pagemap.get(), &entry, sizeof(entry), static_cast<off_t>(a / 4096 * sizeof(entry))) == 8)
			present += entry >> 63;
	}
	return present;
}

TEST(Userfault, MapsPastPagesMappedAlready)
{
	REGISTER_OR_SKIP(r);
	for (size_t i = 0; i < kChunks; i++)
		memset(r.fill + i * kChunk, static_cast<int>(i + 1), kChunk);
	Userfault uffd(std::move(r.uffd));
	// Scattered pages mapped first, one of them the range's first page: the kernel refuses a range
	// starting at a mapped page (EEXIST) and stops before one inside it.
	for (uint64_t page : {0ul, 3ul, 4ul, 40ul, kChunk * kChunks / 4096 - 1})
		ASSERT_TRUE(uffd.map_from_file(r.addr(0) + page * 4096, 4096));
	ASSERT_EQ(present_pages(r.addr(0), kChunk * kChunks), 5u);
	ASSERT_TRUE(uffd.map_from_file(r.addr(0), kChunk * kChunks));
	ASSERT_EQ(present_pages(r.addr(0), kChunk * kChunks), kChunk * kChunks / 4096) << "pages left unmapped";
	EXPECT_EQ(r.wrong_pages(), 0u);
}

TEST(LazyDecoded, WithoutAUserfaultfdNothingIsLazy)
{
	LazyDecoded lazy;
	lazy.add(kPid, {{0x10000, 0x20000}});
	EXPECT_TRUE(lazy.attach([](pid_t) { return -ENOENT; }).empty());
	EXPECT_TRUE(lazy.has(kPid));
	EXPECT_FALSE(lazy.has(kPid + 1));
	EXPECT_TRUE(lazy.finish());
}

} // namespace
} // namespace cuda_criu
