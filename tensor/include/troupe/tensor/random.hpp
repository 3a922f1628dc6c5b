#pragma once
// Counter-based random numbers (Philox 4x32-10).
#include <array>
#include <cstdint>

#include "troupe/tensor/fwd.hpp"

namespace troupe {

/// Philox 4x32-10 (Salmon et al., SC'11): a keyed bijection of a 128-bit
/// counter. The same key and counter give the same four words in any process,
/// thread or order of calls — which is what lets distributed tests compare
/// against single-process runs.
std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key);

/// A random stream: a seed and a position. Element i of a draw of n values
/// uses counter `offset + i` (four 32-bit words per counter for uniform
/// floats), after which `offset` advances. Copy a generator to replay it.
struct generator {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;

  /// An independent stream derived from this seed and a name (for example a
  /// parameter's fully qualified name), so initialisation does not depend on
  /// the order in which parameters are created.
  generator fork(std::uint64_t salt) const;
};

/// 64-bit FNV-1a of a string; used to derive per-name streams.
std::uint64_t stable_hash(const char* text, std::size_t length);

/// The process-wide default stream used by dropout and other ops when no
/// generator is passed. Seeded with `manual_seed`; its offset is saved and
/// restored by recomputation so that dropout masks replay identically.
generator& default_generator();
void manual_seed(std::uint64_t seed);

} // namespace troupe
