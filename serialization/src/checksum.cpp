#include "troupe/serialization/checksum.hpp"

#include <array>
#include <cstring>

namespace troupe {

namespace {

constexpr std::uint32_t castagnoli_reflected = 0x82F63B78u;

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    auto crc = i;
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc >> 1) ^ ((crc & 1u) ? castagnoli_reflected : 0u);
    table[i] = crc;
  }
  return table;
}

constexpr auto table = make_table();

std::uint32_t crc32c_table(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::uint32_t crc,
                                                               const unsigned char* p,
                                                               std::size_t n) {
  std::uint64_t state = crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    state = __builtin_ia32_crc32di(state, word);
  }
  auto crc32 = static_cast<std::uint32_t>(state);
  for (; n > 0; --n, ++p)
    crc32 = __builtin_ia32_crc32qi(crc32, *p);
  return crc32;
}

bool have_sse42() {
  static const bool result = __builtin_cpu_supports("sse4.2");
  return result;
}
#endif

} // namespace

std::uint32_t crc32c(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
  auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  crc = ~crc;
#if defined(__x86_64__)
  if (have_sse42())
    return ~crc32c_sse42(crc, p, bytes.size());
#endif
  return ~crc32c_table(crc, p, bytes.size());
}

} // namespace troupe
