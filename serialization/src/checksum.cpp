#include "troupe/serialization/checksum.hpp"

#include <algorithm>
#include <array>

#include <isa-l/crc.h>

namespace troupe {

namespace {

constexpr std::uint32_t castagnoli_reflected = 0x82F63B78u;

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

} // namespace

std::uint32_t crc32c(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
  // ISA-L takes an int length, a pointer without const (it only reads), and
  // neither inverts its start value nor its result, where CRC32C inverts both.
  constexpr std::size_t most_per_call = std::size_t{1} << 30;
  auto* p = reinterpret_cast<unsigned char*>(const_cast<std::byte*>(bytes.data()));
  crc = ~crc;
  for (std::size_t left = bytes.size(); left > 0;) {
    const auto n = std::min(left, most_per_call);
    crc = crc32_iscsi(p, static_cast<int>(n), crc);
    p += n;
    left -= n;
  }
  return ~crc;
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
