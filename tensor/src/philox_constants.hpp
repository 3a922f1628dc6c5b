#pragma once
// Private: Philox 4x32-10's multipliers and key schedule, shared by the
// scalar bijection (philox.hpp) and its AVX2 lanes (cpu_vector_math.cpp),
// which may include no header with inline functions (cpu_vector_lanes.hpp).
#include <cstdint>

namespace troupe::detail::philox_constants {

inline constexpr std::uint32_t multiplier0 = 0xD2511F53u;
inline constexpr std::uint32_t multiplier1 = 0xCD9E8D57u;
inline constexpr std::uint32_t weyl0 = 0x9E3779B9u;
inline constexpr std::uint32_t weyl1 = 0xBB67AE85u;

} // namespace troupe::detail::philox_constants
