// The bit kernels for CPUs with AVX-512 (cpu_vector_math.hpp:
// vector_math::avx512): Philox 4x32-10 sixteen counters at a time, dropout
// masks drawn from it, and float32 <-> bfloat16 conversion sixteen elements
// at a time. The same bits as the scalar rules (philox.hpp, dtype.hpp) and
// the AVX2 copy (cpu_vector_bits.cpp); the wider lanes halve the
// instructions per element. Compiled with the AVX-512 flags
// (tensor/CMakeLists.txt), run only where avx512_chosen(). Like the other
// vector files it includes no C++ standard header with inline functions
// (cpu_vector_lanes.hpp says why).
#include "cpu_vector_math.hpp"

#include <immintrin.h>

#include "cpu_vector_tail.hpp"
#include "philox_constants.hpp"

namespace troupe::detail::vector_math {

namespace {

/// Two blocks of sixteen counters per call: the ten rounds of one block are
/// a chain of dependent multiplies, and a second independent chain fills
/// the multiplier's latency.
constexpr int blocks = 2;
constexpr std::int64_t step = 16 * blocks;

/// The high and low 32 bits of a * m per 32-bit lane (m splatted): as in
/// the AVX2 copy, the even lanes' products, then the odd lanes' shifted down,
/// blended back in lane order.
/// (The zero-masking forms with every lane kept: GCC 12's plain forms pass
/// an undefined vector that -Wuninitialized reports.)
inline void mul_hi_lo(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_maskz_mul_epu32(0xFF, a, m);
  const __m512i odd = _mm512_maskz_mul_epu32(0xFF, _mm512_maskz_srli_epi64(0xFF, a, 32), m);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_maskz_slli_epi64(0xFF, odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_maskz_srli_epi64(0xFF, even, 32), odd);
}

/// The counters position, ..., position + 15 as low and high words per
/// lane; a wrap of the low word carries into the high word of the lanes
/// after it.
inline void counters16(std::uint64_t position, __m512i& low, __m512i& high) {
  const __m512i base = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(position)));
  low = _mm512_add_epi32(base, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __mmask16 wrapped = _mm512_cmplt_epu32_mask(low, base);
  const __m512i top = _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(position >> 32)));
  high = _mm512_mask_add_epi32(top, wrapped, top, _mm512_set1_epi32(1));
}

/// Philox 4x32-10 of `blocks` x 16 counters from `position` on (philox.hpp's
/// rounds, lane by lane; c2 = c3 = 0, so the first round's second product
/// is zero and skipped): the first two words of each.
inline void philox(std::uint64_t seed, std::uint64_t position, __m512i (&w0)[blocks], __m512i (&w1)[blocks]) {
  using namespace philox_constants;
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(multiplier0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(multiplier1));
  auto k0 = static_cast<std::uint32_t>(seed);
  auto k1 = static_cast<std::uint32_t>(seed >> 32);
  __m512i c0[blocks], c1[blocks], c2[blocks], c3[blocks];
  for (int b = 0; b < blocks; ++b) {
    __m512i low, high, hi0, lo0;
    counters16(position + static_cast<std::uint64_t>(16 * b), low, high);
    mul_hi_lo(low, m0, hi0, lo0);
    c0[b] = _mm512_xor_si512(high, _mm512_set1_epi32(static_cast<int>(k0)));
    c1[b] = _mm512_setzero_si512();
    c2[b] = _mm512_xor_si512(hi0, _mm512_set1_epi32(static_cast<int>(k1)));
    c3[b] = lo0;
  }
  for (int round = 1; round < 10; ++round) {
    k0 += weyl0;
    k1 += weyl1;
    const __m512i key0 = _mm512_set1_epi32(static_cast<int>(k0));
    const __m512i key1 = _mm512_set1_epi32(static_cast<int>(k1));
    for (int b = 0; b < blocks; ++b) {
      __m512i hi0, lo0, hi1, lo1;
      mul_hi_lo(c0[b], m0, hi0, lo0);
      mul_hi_lo(c2[b], m1, hi1, lo1);
      c0[b] = _mm512_ternarylogic_epi32(hi1, c1[b], key0, 0x96); // three-way xor
      c1[b] = lo1;
      c2[b] = _mm512_ternarylogic_epi32(hi0, c3[b], key1, 0x96);
      c3[b] = lo0;
    }
  }
  for (int b = 0; b < blocks; ++b) {
    w0[b] = c0[b];
    w1[b] = c1[b];
  }
}

/// Calls f(at, lanes, w0, w1) for each block of sixteen counters from
/// start + at, with the mask of its lanes below n and the block's first two
/// words.
template <class F> void for_each_block(std::uint64_t seed, std::uint64_t start, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; i += step) {
    __m512i a[blocks], b[blocks];
    philox(seed, start + static_cast<std::uint64_t>(i), a, b);
    for (int k = 0; k < blocks && i + 16 * k < n; ++k) {
      const std::int64_t at = i + 16 * k;
      const auto lanes = n - at >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (n - at)) - 1u);
      f(at, lanes, a[k], b[k]);
    }
  }
}

/// Sixteen floats' bfloat16 bits (nearest, ties to even; a NaN stays a
/// quiet NaN): the AVX2 copy's rule in sixteen lanes.
inline __m256i bfloat16_lanes(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i high = _mm512_maskz_srli_epi32(0xFFFF, u, 16);
  const __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded =
    _mm512_maskz_srli_epi32(0xFFFF, _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
  const __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  const __m512i bits = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), rounded, quiet_nan);
  return _mm512_maskz_cvtepi32_epi16(0xFFFF, bits);
}

/// Sixteen bfloat16 bits to floats, exactly.
inline __m512 floats_of(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, bits), 16));
}

/// Sixteen floats at x to bfloat16 bits at y, with a cached or (y 32-byte
/// aligned) a streaming store.
inline void to_bfloat16_16(const float* x, std::uint16_t* y) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), bfloat16_lanes(_mm512_loadu_ps(x)));
}
inline void to_bfloat16_16_streamed(const float* x, std::uint16_t* y) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(y), bfloat16_lanes(_mm512_loadu_ps(x)));
}

/// Sixteen bfloat16 bits at x to floats at y, with a cached or (y 64-byte
/// aligned) a streaming store.
inline void from_bfloat16_16(const std::uint16_t* x, float* y) {
  _mm512_storeu_ps(y, floats_of(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))));
}
inline void from_bfloat16_16_streamed(const std::uint16_t* x, float* y) {
  _mm512_stream_ps(y, floats_of(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))));
}

} // namespace

namespace avx512 {

void philox_words(std::uint64_t seed, std::uint64_t start, std::int64_t n, std::uint32_t* w0, std::uint32_t* w1) {
  for_each_block(seed, start, n, [&](std::int64_t at, __mmask16 lanes, __m512i a, __m512i b) {
    _mm512_mask_storeu_epi32(w0 + at, lanes, a);
    if (w1 != nullptr)
      _mm512_mask_storeu_epi32(w1 + at, lanes, b);
  });
}

void dropout_mask(std::uint64_t seed, std::uint64_t start, std::int64_t n, float p, float scale, float* y) {
  const __m512 threshold = _mm512_set1_ps(p);
  const __m512 kept = _mm512_set1_ps(scale);
  const __m512 unit = _mm512_set1_ps(0x1.0p-24f);
  for_each_block(seed, start, n, [&](std::int64_t at, __mmask16 lanes, __m512i a, __m512i) {
    // uniform24 (philox.hpp), compared as the scalar fill compares it.
    const __m512 u = _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_srli_epi32(0xFFFF, a, 8)), unit);
    _mm512_mask_storeu_ps(y + at, lanes, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, threshold, _CMP_GE_OQ), kept));
  });
}

void to_bfloat16(const float* x, std::uint16_t* y, std::int64_t n) {
  over_vectors_streaming<16>(
    n, [](const float* a, std::uint16_t* b) { to_bfloat16_16(a, b); },
    [](const float* a, std::uint16_t* b) { to_bfloat16_16_streamed(a, b); }, x, y);
}

void from_bfloat16(const std::uint16_t* x, float* y, std::int64_t n) {
  over_vectors_streaming<16>(
    n, [](const std::uint16_t* a, float* b) { from_bfloat16_16(a, b); },
    [](const std::uint16_t* a, float* b) { from_bfloat16_16_streamed(a, b); }, x, y);
}

} // namespace avx512

} // namespace troupe::detail::vector_math
