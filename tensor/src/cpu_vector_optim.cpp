// The Adam step in AVX2 double lanes (cpu_vector_math.hpp: adam_step).
//
// The element loop (cpu_optim.cpp) computes in double and spends most of
// its time in one scalar square root and two divisions per element; four
// lanes do four at once. The arithmetic is the loop's, operation by
// operation: this file is compiled with -mavx2 but without -mfma
// (tensor/CMakeLists.txt), so no multiply and add is fused, and the
// conversions round to nearest as static_cast does. Like the other vector
// files it includes no C++ standard header with inline functions
// (cpu_vector_lanes.hpp says why).
#include "cpu_vector_math.hpp"
#include "cpu_vector_tail.hpp"

#include <immintrin.h>

namespace troupe::detail::vector_math {

namespace {

/// An adam_scalars in every lane, with 1 - beta1 and 1 - beta2 formed as
/// the loop forms them.
struct adam_lanes {
  __m256d beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias_correction2_sqrt, l2, decay;
  explicit adam_lanes(const adam_scalars& s)
    : beta1(_mm256_set1_pd(s.beta1)), one_minus_beta1(_mm256_set1_pd(1.0 - s.beta1)), beta2(_mm256_set1_pd(s.beta2)),
      one_minus_beta2(_mm256_set1_pd(1.0 - s.beta2)), eps(_mm256_set1_pd(s.eps)),
      step_size(_mm256_set1_pd(s.step_size)), bias_correction2_sqrt(_mm256_set1_pd(s.bias_correction2_sqrt)),
      l2(_mm256_set1_pd(s.l2)), decay(_mm256_set1_pd(s.decay)) {}
};

/// Four elements' step: p, m and v are replaced by their new values.
inline void step4(const adam_lanes& s, __m256d& p, __m256d g, __m256d& m, __m256d& v) {
  const __m256d param = _mm256_mul_pd(p, s.decay);
  const __m256d gi = _mm256_add_pd(g, _mm256_mul_pd(s.l2, p));
  m = _mm256_add_pd(_mm256_mul_pd(s.beta1, m), _mm256_mul_pd(s.one_minus_beta1, gi));
  v = _mm256_add_pd(_mm256_mul_pd(s.beta2, v), _mm256_mul_pd(_mm256_mul_pd(s.one_minus_beta2, gi), gi));
  const __m256d denominator = _mm256_add_pd(_mm256_div_pd(_mm256_sqrt_pd(v), s.bias_correction2_sqrt), s.eps);
  p = _mm256_sub_pd(param, _mm256_div_pd(_mm256_mul_pd(s.step_size, m), denominator));
}

/// Eight float elements at p, g, m, v.
inline void step8(const adam_lanes& s, float* p, const float* g, float* m, float* v) {
  const __m256 p8 = _mm256_loadu_ps(p), g8 = _mm256_loadu_ps(g), m8 = _mm256_loadu_ps(m), v8 = _mm256_loadu_ps(v);
  auto low = [](__m256 x) { return _mm256_cvtps_pd(_mm256_castps256_ps128(x)); };
  auto high = [](__m256 x) { return _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)); };
  __m256d p_low = low(p8), m_low = low(m8), v_low = low(v8);
  __m256d p_high = high(p8), m_high = high(m8), v_high = high(v8);
  step4(s, p_low, low(g8), m_low, v_low);
  step4(s, p_high, high(g8), m_high, v_high);
  auto join = [](__m256d l, __m256d h) { return _mm256_set_m128(_mm256_cvtpd_ps(h), _mm256_cvtpd_ps(l)); };
  _mm256_storeu_ps(p, join(p_low, p_high));
  _mm256_storeu_ps(m, join(m_low, m_high));
  _mm256_storeu_ps(v, join(v_low, v_high));
}

/// Four double elements at p, g, m, v.
inline void step4(const adam_lanes& s, double* p, const double* g, double* m, double* v) {
  __m256d p4 = _mm256_loadu_pd(p), m4 = _mm256_loadu_pd(m), v4 = _mm256_loadu_pd(v);
  step4(s, p4, _mm256_loadu_pd(g), m4, v4);
  _mm256_storeu_pd(p, p4);
  _mm256_storeu_pd(m, m4);
  _mm256_storeu_pd(v, v4);
}

} // namespace

void adam_step(float* p, const float* g, float* m, float* v, std::int64_t n, const adam_scalars& scalars) {
  const adam_lanes s(scalars);
  over_vectors<8>(n, [&](float* pp, const float* gg, float* mm, float* vv) { step8(s, pp, gg, mm, vv); }, p, g, m, v);
}

void adam_step(double* p, const double* g, double* m, double* v, std::int64_t n, const adam_scalars& scalars) {
  const adam_lanes s(scalars);
  over_vectors<4>(n, [&](double* pp, const double* gg, double* mm, double* vv) { step4(s, pp, gg, mm, vv); }, p, g, m,
                  v);
}

} // namespace troupe::detail::vector_math
