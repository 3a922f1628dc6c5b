#pragma once
// Private: the Philox 4x32-10 bijection, inline so that the fill kernels
// get it unrolled, and the conversions of its words to numbers. The CUDA
// backend compiles the same functions for the device (cuda_random.cu), so
// both backends draw the same numbers.
#include <array>
#include <cstdint>

#include "philox_constants.hpp"

#ifdef __CUDACC__
#define TROUPE_HOST_DEVICE __host__ __device__
#else
#define TROUPE_HOST_DEVICE
#endif

namespace troupe::detail {

TROUPE_HOST_DEVICE inline std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c,
                                                   std::array<std::uint32_t, 2> k) {
  using namespace philox_constants;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      // The key schedule: a Weyl sequence, bumped between rounds.
      k[0] += weyl0;
      k[1] += weyl1;
    }
    const auto p0 = static_cast<std::uint64_t>(multiplier0) * c[0];
    const auto p1 = static_cast<std::uint64_t>(multiplier1) * c[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32);
    const auto lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32);
    const auto lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
  }
  return c;
}

/// The four words for element `index` of the stream (seed, offset).
TROUPE_HOST_DEVICE inline std::array<std::uint32_t, 4> philox_at(std::uint64_t seed, std::uint64_t position) {
  return philox4x32_10({static_cast<std::uint32_t>(position),
                        static_cast<std::uint32_t>(position >> 32), 0u, 0u},
                       {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

/// Uniform in [0, 1) from the top 24 bits of a word (exact in float32).
TROUPE_HOST_DEVICE inline float uniform24(std::uint32_t word) {
  return static_cast<float>(word >> 8) * 0x1.0p-24f;
}

/// Uniform in [0, 1) from the top 53 bits of two words (exact in float64).
TROUPE_HOST_DEVICE inline double uniform53(std::uint32_t high, std::uint32_t low) {
  const auto bits = ((static_cast<std::uint64_t>(high) << 32) | low) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

} // namespace troupe::detail
