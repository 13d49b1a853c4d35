#include "base/crc32c.h"

#include <array>
#include <cstring>

namespace cuda_criu {
namespace {

constexpr uint32_t kPoly = 0x82f63b78; // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> make_table()
{
	std::array<uint32_t, 256> t{};
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
		t[i] = c;
	}
	return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t crc32c_table(const uint8_t *p, size_t len, uint32_t crc)
{
	for (size_t i = 0; i < len; i++)
		crc = kTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t *p, size_t len, uint32_t crc)
{
	uint64_t c = crc;
	for (; len >= 8; p += 8, len -= 8) {
		uint64_t v;
		std::memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
	}
	auto c32 = static_cast<uint32_t>(c);
	for (; len; p++, len--)
		c32 = __builtin_ia32_crc32qi(c32, *p);
	return c32;
}

bool have_sse42()
{
	static const bool yes = __builtin_cpu_supports("sse4.2");
	return yes;
}
#endif

} // namespace

uint32_t crc32c(const void *data, size_t len, uint32_t crc)
{
	const auto *p = static_cast<const uint8_t *>(data);
	crc = ~crc;
#if defined(__x86_64__)
	if (have_sse42())
		return ~crc32c_sse42(p, len, crc);
#endif
	return ~crc32c_table(p, len, crc);
}

} // namespace cuda_criu
