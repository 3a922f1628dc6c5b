#pragma once
// Private: vector lanes of float and double for the kernels compiled once
// per instruction set (cpu_vector_math.cpp, cpu_vector_rows.cpp): 8 floats
// or 4 doubles where TROUPE_VECTOR_ISA is avx2 (-mavx2 -mfma), 16 floats or
// 8 doubles where it is avx512. The lanes live in that ISA's namespace, so
// the two copies never share a symbol. Include it from no other file. Like
// them it includes no C++ standard header with inline functions
// (<cstdint> has only types), so no inline function shared with the rest
// of the library gets an AVX copy that the linker might keep for a CPU
// without it.
#include <cstdint>

#include <immintrin.h>
#include <sleef.h>

#include "cpu_vector_tail.hpp"

namespace troupe::detail::vector_math::TROUPE_VECTOR_ISA::lanes {

using vector_math::over_vectors;

#if defined(TROUPE_VECTOR_AVX512)

struct float_lanes {
  using scalar = float;
  using vector = __m512;
  static constexpr int width = 16;
  static vector load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, vector v) { _mm512_storeu_ps(p, v); }
  static vector splat(float v) { return _mm512_set1_ps(v); }
  static vector add(vector a, vector b) { return _mm512_add_ps(a, b); }
  static vector sub(vector a, vector b) { return _mm512_sub_ps(a, b); }
  static vector mul(vector a, vector b) { return _mm512_mul_ps(a, b); }
  static vector div(vector a, vector b) { return _mm512_div_ps(a, b); }
  /// a * b + c, rounded once.
  static vector fma(vector a, vector b, vector c) { return _mm512_fmadd_ps(a, b, c); }
  /// a > b ? a : b lane by lane: a NaN in `a` keeps b.
  // The zero-masking form with every lane kept: GCC 12's _mm512_max_ps
  // passes an undefined vector that -Wuninitialized reports.
  static vector max(vector a, vector b) { return _mm512_maskz_max_ps(0xFFFF, a, b); }
  /// a < b ? c : d lane by lane.
  static vector select_less(vector a, vector b, vector c, vector d) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), d, c);
  }
  static vector exp(vector v) { return Sleef_expf16_u10avx512f(v); }
  static vector tanh(vector v) { return Sleef_tanhf16_u10avx512f(v); }
  static vector erf(vector v) { return Sleef_erff16_u10avx512f(v); }
};

struct double_lanes {
  using scalar = double;
  using vector = __m512d;
  static constexpr int width = 8;
  static vector load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, vector v) { _mm512_storeu_pd(p, v); }
  static vector splat(double v) { return _mm512_set1_pd(v); }
  static vector add(vector a, vector b) { return _mm512_add_pd(a, b); }
  static vector sub(vector a, vector b) { return _mm512_sub_pd(a, b); }
  static vector mul(vector a, vector b) { return _mm512_mul_pd(a, b); }
  static vector div(vector a, vector b) { return _mm512_div_pd(a, b); }
  static vector fma(vector a, vector b, vector c) { return _mm512_fmadd_pd(a, b, c); }
  static vector max(vector a, vector b) { return _mm512_maskz_max_pd(0xFF, a, b); }
  static vector select_less(vector a, vector b, vector c, vector d) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, b, _CMP_LT_OQ), d, c);
  }
  static vector exp(vector v) { return Sleef_expd8_u10avx512f(v); }
  static vector tanh(vector v) { return Sleef_tanhd8_u10avx512f(v); }
  static vector erf(vector v) { return Sleef_erfd8_u10avx512f(v); }
};

#else

struct float_lanes {
  using scalar = float;
  using vector = __m256;
  static constexpr int width = 8;
  static vector load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, vector v) { _mm256_storeu_ps(p, v); }
  static vector splat(float v) { return _mm256_set1_ps(v); }
  static vector add(vector a, vector b) { return _mm256_add_ps(a, b); }
  static vector sub(vector a, vector b) { return _mm256_sub_ps(a, b); }
  static vector mul(vector a, vector b) { return _mm256_mul_ps(a, b); }
  static vector div(vector a, vector b) { return _mm256_div_ps(a, b); }
  /// a * b + c, rounded once.
  static vector fma(vector a, vector b, vector c) { return _mm256_fmadd_ps(a, b, c); }
  /// a > b ? a : b lane by lane: a NaN in `a` keeps b.
  static vector max(vector a, vector b) { return _mm256_max_ps(a, b); }
  /// a < b ? c : d lane by lane.
  static vector select_less(vector a, vector b, vector c, vector d) {
    return _mm256_blendv_ps(d, c, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
  }
  static vector exp(vector v) { return Sleef_expf8_u10avx2(v); }
  static vector tanh(vector v) { return Sleef_tanhf8_u10avx2(v); }
  static vector erf(vector v) { return Sleef_erff8_u10avx2(v); }
};

struct double_lanes {
  using scalar = double;
  using vector = __m256d;
  static constexpr int width = 4;
  static vector load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, vector v) { _mm256_storeu_pd(p, v); }
  static vector splat(double v) { return _mm256_set1_pd(v); }
  static vector add(vector a, vector b) { return _mm256_add_pd(a, b); }
  static vector sub(vector a, vector b) { return _mm256_sub_pd(a, b); }
  static vector mul(vector a, vector b) { return _mm256_mul_pd(a, b); }
  static vector div(vector a, vector b) { return _mm256_div_pd(a, b); }
  static vector fma(vector a, vector b, vector c) { return _mm256_fmadd_pd(a, b, c); }
  static vector max(vector a, vector b) { return _mm256_max_pd(a, b); }
  static vector select_less(vector a, vector b, vector c, vector d) {
    return _mm256_blendv_pd(d, c, _mm256_cmp_pd(a, b, _CMP_LT_OQ));
  }
  static vector exp(vector v) { return Sleef_expd4_u10avx2(v); }
  static vector tanh(vector v) { return Sleef_tanhd4_u10avx2(v); }
  static vector erf(vector v) { return Sleef_erfd4_u10avx2(v); }
};

#endif

/// The lanes of scalar type T.
template <class T> struct lanes_of;
template <> struct lanes_of<float> {
  using type = float_lanes;
};
template <> struct lanes_of<double> {
  using type = double_lanes;
};

/// s[0] + ... + s[count - 1] as a tree of halves (count a power of two):
/// ((0 + 1) + (2 + 3)) + ... . Always inlined: GCC left the 16-lane tree a
/// call of its own inside the row loops.
template <int count, class T> [[gnu::always_inline]] inline T sum_halves(const T* s) {
  if constexpr (count == 1)
    return s[0];
  else
    return sum_halves<count / 2>(s) + sum_halves<count / 2>(s + count / 2);
}

/// The lanes of v summed in a fixed order: ((0 + 1) + (2 + 3)) + ... .
template <class L> typename L::scalar sum_lanes(typename L::vector v) {
  typename L::scalar s[L::width];
  L::store(s, v);
  return sum_halves<L::width>(s);
}

/// y[i] = f(x[i], z[i]) a vector at a time (z may be null: zeros); the last
/// partial vector goes through f too, padded with zeros, so an element's
/// result never depends on its position or on n.
template <class L, class F>
void map(const typename L::scalar* x, const typename L::scalar* z, typename L::scalar* y, std::int64_t n, F f) {
  using T = typename L::scalar;
  if (z == nullptr)
    over_vectors<L::width>(n, [&](const T* xs, T* ys) { L::store(ys, f(L::load(xs), L::splat(T(0)))); }, x, y);
  else
    over_vectors<L::width>(
      n, [&](const T* xs, const T* zs, T* ys) { L::store(ys, f(L::load(xs), L::load(zs))); }, x, z, y);
}

} // namespace troupe::detail::vector_math::TROUPE_VECTOR_ISA::lanes
