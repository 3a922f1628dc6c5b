// The AVX2 bit kernels (cpu_vector_math.hpp: vector_math::avx2): Philox
// 4x32-10 eight counters at a time, and float32 <-> bfloat16 conversion
// sixteen (eight) elements at a time; cpu_vector_bits_avx512.cpp has the
// sixteen-lane copies. Integer work with exact results: every copy gives
// the scalar rules' bits. Compiled with -mavx2 (tensor/CMakeLists.txt) and
// run only once vector_math::available() said so. Like the other vector
// files it includes no C++ standard header with inline functions
// (cpu_vector_lanes.hpp says why).
#include "cpu_vector_math.hpp"

#include <immintrin.h>

#include "cpu_vector_tail.hpp"
#include "philox_constants.hpp"

namespace troupe::detail::vector_math {

namespace {

/// The high and low 32 bits of a * m for each 32-bit lane of `a` (m: a
/// multiplier splatted into every lane). AVX2 multiplies only the even
/// lanes of each 64-bit pair, so the odd lanes are shifted down for a
/// second multiply and the halves blended back in lane order.
inline void mul_hi_lo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

/// Philox 4x32-10 of eight counters (philox.hpp's rounds, lane by lane):
/// counter words c0 (low) and c1 (high) per lane, c2 = c3 = 0, so the first
/// round's second product is zero and is skipped.
inline void philox8(__m256i c0, __m256i c1, std::uint64_t seed, __m256i& w0, __m256i& w1) {
  using namespace philox_constants;
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(multiplier0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(multiplier1));
  auto k0 = static_cast<std::uint32_t>(seed);
  auto k1 = static_cast<std::uint32_t>(seed >> 32);
  __m256i hi0, lo0, hi1, lo1;
  mul_hi_lo(c0, m0, hi0, lo0);
  __m256i c2 = _mm256_xor_si256(hi0, _mm256_set1_epi32(static_cast<int>(k1)));
  __m256i c3 = lo0;
  c0 = _mm256_xor_si256(c1, _mm256_set1_epi32(static_cast<int>(k0)));
  c1 = _mm256_setzero_si256();
  for (int round = 1; round < 10; ++round) {
    k0 += weyl0;
    k1 += weyl1;
    mul_hi_lo(c0, m0, hi0, lo0);
    mul_hi_lo(c2, m1, hi1, lo1);
    const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  w0 = c0;
  w1 = c1;
}

/// The counters position, position + 1, ..., position + 7 as low and high
/// words per lane; the low word may wrap inside the vector, carrying into
/// the high word of the lanes after it.
inline void counters8(std::uint64_t position, __m256i& low, __m256i& high) {
  const __m256i base = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(position)));
  low = _mm256_add_epi32(base, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  // Unsigned low < base (a wrap) as a signed compare with the sign bits flipped.
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(base, sign), _mm256_xor_si256(low, sign));
  high = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(position >> 32))), wrapped);
}

/// Keep (scale) or drop (0) for eight uniforms from w0's top 24 bits:
/// uniform24's value, compared as the scalar fill compares it.
inline __m256 dropout8(__m256i w0, float p, float scale) {
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w0, 8)), _mm256_set1_ps(0x1.0p-24f));
  return _mm256_and_ps(_mm256_cmp_ps(u, _mm256_set1_ps(p), _CMP_GE_OQ), _mm256_set1_ps(scale));
}

} // namespace

namespace avx2 {

void philox_words(std::uint64_t seed, std::uint64_t start, std::int64_t n, std::uint32_t* w0, std::uint32_t* w1) {
  for (std::int64_t i = 0; i < n; i += 8) {
    __m256i low, high, a, b;
    counters8(start + static_cast<std::uint64_t>(i), low, high);
    philox8(low, high, seed, a, b);
    const std::int64_t count = n - i < 8 ? n - i : 8;
    if (count == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w0 + i), a);
      if (w1 != nullptr)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w1 + i), b);
      continue;
    }
    alignas(32) std::uint32_t out0[8], out1[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out0), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out1), b);
    for (std::int64_t lane = 0; lane < count; ++lane) {
      w0[i + lane] = out0[lane];
      if (w1 != nullptr)
        w1[i + lane] = out1[lane];
    }
  }
}

void dropout_mask(std::uint64_t seed, std::uint64_t start, std::int64_t n, float p, float scale, float* y) {
  for (std::int64_t i = 0; i < n; i += 8) {
    __m256i low, high, a, b;
    counters8(start + static_cast<std::uint64_t>(i), low, high);
    philox8(low, high, seed, a, b);
    const __m256 mask = dropout8(a, p, scale);
    const std::int64_t count = n - i < 8 ? n - i : 8;
    if (count == 8) {
      _mm256_storeu_ps(y + i, mask);
      continue;
    }
    alignas(32) float out[8];
    _mm256_store_ps(out, mask);
    for (std::int64_t lane = 0; lane < count; ++lane)
      y[i + lane] = out[lane];
  }
}

} // namespace avx2

namespace {

/// Eight floats' bfloat16 bits in the low 16 bits of each 32-bit lane.
inline __m256i bfloat16_lanes(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(u, 16);
  const __m256i odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(rounded, quiet_nan, _mm256_castps_si256(nan));
}

/// Sixteen floats at x to bfloat16 bits at y.
inline void to_bfloat16_16(const float* x, std::uint16_t* y) {
  const __m256i low = bfloat16_lanes(_mm256_loadu_ps(x));
  const __m256i high = bfloat16_lanes(_mm256_loadu_ps(x + 8));
  // packus packs within 128-bit halves: [low 0-3, high 0-3, low 4-7, high 4-7].
  const __m256i packed = _mm256_packus_epi32(low, high);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), _mm256_permute4x64_epi64(packed, 0xD8));
}

/// Eight bfloat16 bits at x to floats at y.
inline void from_bfloat16_8(const std::uint16_t* x, float* y) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  _mm256_storeu_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
}

/// to_bfloat16_16 with a streaming store; y 32-byte aligned.
inline void to_bfloat16_16_streamed(const float* x, std::uint16_t* y) {
  const __m256i packed = _mm256_packus_epi32(bfloat16_lanes(_mm256_loadu_ps(x)), bfloat16_lanes(_mm256_loadu_ps(x + 8)));
  _mm256_stream_si256(reinterpret_cast<__m256i*>(y), _mm256_permute4x64_epi64(packed, 0xD8));
}

/// from_bfloat16_8 with a streaming store; y 32-byte aligned.
inline void from_bfloat16_8_streamed(const std::uint16_t* x, float* y) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  _mm256_stream_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
}

} // namespace

namespace avx2 {

void to_bfloat16(const float* x, std::uint16_t* y, std::int64_t n) {
  over_vectors_streaming<16>(
    n, [](const float* a, std::uint16_t* b) { to_bfloat16_16(a, b); },
    [](const float* a, std::uint16_t* b) { to_bfloat16_16_streamed(a, b); }, x, y);
}

void from_bfloat16(const std::uint16_t* x, float* y, std::int64_t n) {
  over_vectors_streaming<8>(
    n, [](const std::uint16_t* a, float* b) { from_bfloat16_8(a, b); },
    [](const std::uint16_t* a, float* b) { from_bfloat16_8_streamed(a, b); }, x, y);
}

} // namespace avx2

} // namespace troupe::detail::vector_math
