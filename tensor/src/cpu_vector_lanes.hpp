#pragma once
// Private: AVX2 lanes of float and double for the files compiled with
// -mavx2 -mfma (cpu_vector_math.cpp, cpu_vector_rows.cpp). Include it from
// no other file. Like them it includes no C++ standard header with inline
// functions (<cstdint> has only types), so no inline function shared with
// the rest of the library gets an AVX2 copy that the linker might keep for
// a CPU without it.
#include <cstdint>

#include <immintrin.h>
#include <sleef.h>

namespace troupe::detail::vector_math::lanes {

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

/// The lanes of scalar type T.
template <class T> struct lanes_of;
template <> struct lanes_of<float> {
  using type = float_lanes;
};
template <> struct lanes_of<double> {
  using type = double_lanes;
};

/// The lanes of v summed in a fixed order: ((0 + 1) + (2 + 3)) + ... .
template <class L> typename L::scalar sum_lanes(typename L::vector v) {
  typename L::scalar s[L::width];
  L::store(s, v);
  if constexpr (L::width == 8)
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  else
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/// y[i] = f(x[i], z[i]) a vector at a time (z may be null: zeros); the last
/// partial vector goes through f too, padded with zeros, so an element's
/// result never depends on its position or on n.
template <class L, class F>
void map(const typename L::scalar* x, const typename L::scalar* z, typename L::scalar* y, std::int64_t n, F f) {
  using T = typename L::scalar;
  std::int64_t i = 0;
  for (; i + L::width <= n; i += L::width)
    L::store(y + i, f(L::load(x + i), z != nullptr ? L::load(z + i) : L::splat(T(0))));
  if (i < n) {
    T xs[L::width] = {};
    T zs[L::width] = {};
    T ys[L::width];
    for (std::int64_t j = 0; i + j < n; ++j) {
      xs[j] = x[i + j];
      zs[j] = z != nullptr ? z[i + j] : T(0);
    }
    L::store(ys, f(L::load(xs), L::load(zs)));
    for (std::int64_t j = 0; i + j < n; ++j)
      y[i + j] = ys[j];
  }
}

} // namespace troupe::detail::vector_math::lanes
