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

/// CRC arithmetic over GF(2): a CRC register is a vector of 32 bits and
/// appending zero bits is a linear map, a 32 x 32 bit matrix (one word per
/// column). Appending n zero bytes squares the one-bit map log2(8n) times.
std::uint32_t times(const std::array<std::uint32_t, 32>& matrix, std::uint32_t vector) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; vector != 0; vector >>= 1, ++i)
    if (vector & 1u)
      sum ^= matrix[i];
  return sum;
}

std::array<std::uint32_t, 32> squared(const std::array<std::uint32_t, 32>& matrix) {
  std::array<std::uint32_t, 32> out{};
  for (std::size_t i = 0; i < 32; ++i)
    out[i] = times(matrix, matrix[i]);
  return out;
}

/// The map "append one zero bit": shift right, folding in the polynomial
/// when a one leaves.
std::array<std::uint32_t, 32> one_zero_bit() {
  std::array<std::uint32_t, 32> map{};
  map[0] = castagnoli_reflected;
  for (std::size_t i = 1; i < 32; ++i)
    map[i] = std::uint32_t{1} << (i - 1);
  return map;
}

#if defined(__x86_64__)
/// The map "append `bytes` zero bytes" on a CRC register (no pre- or
/// post-conditioning), `bytes` a power of two.
std::array<std::uint32_t, 32> zeros_operator(std::size_t bytes) {
  auto map = one_zero_bit();
  for (int i = 0; i < 3; ++i) // 2, 4, 8 bits: one byte
    map = squared(map);
  for (std::size_t n = 1; n < bytes; n *= 2)
    map = squared(map);
  return map;
}

/// Bytes each of the three chains takes per round.
constexpr std::size_t chain_bytes = 4096;

/// The crc32 instruction over 8 bytes at a time. It has a latency of three
/// cycles and a throughput of one, so three independent chains over
/// neighbouring blocks run about three times as fast as one; the CRC
/// register is linear, so the chains join exactly: crc(s, A B) =
/// zeros(|B|) crc(s, A) xor crc(0, B).
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::uint32_t crc,
                                                               const unsigned char* p,
                                                               std::size_t n) {
  static const auto shift = zeros_operator(chain_bytes);
  auto word_at = [](const unsigned char* at) {
    std::uint64_t word;
    std::memcpy(&word, at, 8);
    return word;
  };
  std::uint64_t state = crc;
  for (; n >= 3 * chain_bytes; n -= 3 * chain_bytes, p += 3 * chain_bytes) {
    std::uint64_t second = 0, third = 0;
    for (std::size_t i = 0; i < chain_bytes; i += 8) {
      state = __builtin_ia32_crc32di(state, word_at(p + i));
      second = __builtin_ia32_crc32di(second, word_at(p + chain_bytes + i));
      third = __builtin_ia32_crc32di(third, word_at(p + 2 * chain_bytes + i));
    }
    state = times(shift, static_cast<std::uint32_t>(state)) ^ static_cast<std::uint32_t>(second);
    state = times(shift, static_cast<std::uint32_t>(state)) ^ static_cast<std::uint32_t>(third);
  }
  for (; n >= 8; n -= 8, p += 8)
    state = __builtin_ia32_crc32di(state, word_at(p));
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

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b) noexcept {
  if (length_b == 0)
    return crc_a;
  auto odd = one_zero_bit();
  auto even = squared(odd); // two zero bits
  odd = squared(even);      // four
  // Apply 8 * length_b zero bits to crc_a, squaring the map bit by bit of the length.
  for (;;) {
    even = squared(odd);
    if (length_b & 1u)
      crc_a = times(even, crc_a);
    length_b >>= 1;
    if (length_b == 0)
      break;
    odd = squared(even);
    if (length_b & 1u)
      crc_a = times(odd, crc_a);
    length_b >>= 1;
    if (length_b == 0)
      break;
  }
  return crc_a ^ crc_b;
}

} // namespace troupe
