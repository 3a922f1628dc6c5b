// SLEEF's AVX2 vector functions over contiguous arrays (cpu_vector_math.hpp);
// float32 GELU is oneDNN's (cpu_onednn_gelu.cpp).
//
// This file is compiled with -mavx2 -mfma (tensor/CMakeLists.txt), and its
// functions run only once vector_math::available() (in cpu_elementwise.cpp)
// said the CPU has both; cpu_vector_lanes.hpp says why it includes no C++
// standard header.
#include "cpu_vector_math.hpp"

#include "cpu_vector_lanes.hpp"
#include "philox_constants.hpp"

namespace troupe::detail::vector_math {

namespace {

using lanes::double_lanes;
using lanes::float_lanes;
using lanes::map;

constexpr double sqrt1_2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double inv_sqrt_2pi = 0.39894228040143267794; // 1 / sqrt(2 pi)

template <class L> void exp_of(const typename L::scalar* x, typename L::scalar* y, std::int64_t n) {
  map<L>(x, nullptr, y, n, [](auto v, auto) { return L::exp(v); });
}

template <class L> void tanh_of(const typename L::scalar* x, typename L::scalar* y, std::int64_t n) {
  map<L>(x, nullptr, y, n, [](auto v, auto) { return L::tanh(v); });
}

template <class L> void sigmoid_of(const typename L::scalar* x, typename L::scalar* y, std::int64_t n) {
  using T = typename L::scalar;
  map<L>(x, nullptr, y, n, [](auto v, auto) {
    const auto one = L::splat(T(1));
    return L::div(one, L::add(one, L::exp(L::mul(v, L::splat(T(-1))))));
  });
}

template <class L> void gelu_of(const typename L::scalar* x, typename L::scalar* y, std::int64_t n) {
  using T = typename L::scalar;
  map<L>(x, nullptr, y, n, [](auto v, auto) {
    const auto cdf = L::mul(L::splat(T(0.5)), L::add(L::splat(T(1)), L::erf(L::mul(v, L::splat(T(sqrt1_2))))));
    return L::mul(v, cdf);
  });
}

template <class L>
void gelu_backward_of(const typename L::scalar* grad, const typename L::scalar* x, typename L::scalar* y,
                      std::int64_t n) {
  using T = typename L::scalar;
  map<L>(x, grad, y, n, [](auto v, auto g) {
    // d/dx x Phi(x) = Phi(x) + x phi(x).
    const auto cdf = L::mul(L::splat(T(0.5)), L::add(L::splat(T(1)), L::erf(L::mul(v, L::splat(T(sqrt1_2))))));
    const auto pdf = L::mul(L::exp(L::mul(L::mul(v, v), L::splat(T(-0.5)))), L::splat(T(inv_sqrt_2pi)));
    return L::mul(g, L::add(cdf, L::mul(v, pdf)));
  });
}

constexpr double sqrt_2_over_pi = 0.79788456080286535588; // sqrt(2 / pi)
constexpr double gelu_tanh_cubic = 0.044715;

/// sigmoid(2 u) and 1 - sigmoid(2 u) for gelu_tanh's u = sqrt(2 / pi) (x +
/// 0.044715 x^3), with 0.5 (1 + tanh(u)) = sigmoid(2 u) = 1 / (1 + e), e =
/// exp(-2 u). 1 - s is e s where s > 1/2 (1 - s would cancel) and 1 - s
/// elsewhere (e may be inf there: exp's overflow for very negative x gives
/// s = 0, not NaN).
template <class L> struct gelu_tanh_gates {
  typename L::vector s;
  typename L::vector one_minus_s;
};

template <class L> gelu_tanh_gates<L> gelu_tanh_gate(typename L::vector v) {
  using T = typename L::scalar;
  const auto one = L::splat(T(1));
  const auto inner = L::fma(L::mul(v, v), L::splat(T(gelu_tanh_cubic)), one);
  const auto e = L::exp(L::mul(L::mul(v, inner), L::splat(T(-2 * sqrt_2_over_pi))));
  const auto s = L::div(one, L::add(one, e));
  return {s, L::select_less(e, one, L::mul(e, s), L::sub(one, s))};
}

template <class L> void gelu_tanh_of(const typename L::scalar* x, typename L::scalar* y, std::int64_t n) {
  map<L>(x, nullptr, y, n, [](auto v, auto) { return L::mul(v, gelu_tanh_gate<L>(v).s); });
}

template <class L>
void gelu_tanh_backward_of(const typename L::scalar* grad, const typename L::scalar* x, typename L::scalar* y,
                           std::int64_t n) {
  using T = typename L::scalar;
  map<L>(x, grad, y, n, [](auto v, auto g) {
    // d/dx x s(2u) = s + x s (1 - s) 2 u', u' = sqrt(2 / pi) (1 + 3 0.044715 x^2).
    const auto gates = gelu_tanh_gate<L>(v);
    const auto du2 = L::mul(L::fma(L::mul(v, v), L::splat(T(3 * gelu_tanh_cubic)), L::splat(T(1))),
                            L::splat(T(2 * sqrt_2_over_pi)));
    const auto slope = L::mul(L::mul(v, L::mul(gates.s, gates.one_minus_s)), du2);
    return L::mul(g, L::add(gates.s, slope));
  });
}

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
/// counter words c0 (low) and c1 (high) per lane, c2 = c3 = 0.
inline void philox8(__m256i c0, __m256i c1, std::uint64_t seed, __m256i& w0, __m256i& w1) {
  using namespace philox_constants;
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(multiplier0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(multiplier1));
  auto k0 = static_cast<std::uint32_t>(seed);
  auto k1 = static_cast<std::uint32_t>(seed >> 32);
  __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += weyl0;
      k1 += weyl1;
    }
    __m256i hi0, lo0, hi1, lo1;
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

} // namespace

void philox_words(std::uint64_t seed, std::uint64_t start, std::int64_t n, std::uint32_t* w0, std::uint32_t* w1) {
  for (std::int64_t i = 0; i < n; i += 8) {
    // The eight counters' words, in scalar: a carry into the high word may
    // fall between two lanes.
    alignas(32) std::uint32_t low[8], high[8], out0[8], out1[8];
    for (int lane = 0; lane < 8; ++lane) {
      const std::uint64_t position = start + static_cast<std::uint64_t>(i + lane);
      low[lane] = static_cast<std::uint32_t>(position);
      high[lane] = static_cast<std::uint32_t>(position >> 32);
    }
    __m256i a, b;
    philox8(_mm256_load_si256(reinterpret_cast<const __m256i*>(low)),
            _mm256_load_si256(reinterpret_cast<const __m256i*>(high)), seed, a, b);
    const std::int64_t count = n - i < 8 ? n - i : 8;
    if (count == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w0 + i), a);
      if (w1 != nullptr)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w1 + i), b);
      continue;
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(out0), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out1), b);
    for (std::int64_t lane = 0; lane < count; ++lane) {
      w0[i + lane] = out0[lane];
      if (w1 != nullptr)
        w1[i + lane] = out1[lane];
    }
  }
}

void exp(const float* x, float* y, std::int64_t n) { exp_of<float_lanes>(x, y, n); }
void exp(const double* x, double* y, std::int64_t n) { exp_of<double_lanes>(x, y, n); }
void tanh(const float* x, float* y, std::int64_t n) { tanh_of<float_lanes>(x, y, n); }
void tanh(const double* x, double* y, std::int64_t n) { tanh_of<double_lanes>(x, y, n); }
void sigmoid(const float* x, float* y, std::int64_t n) { sigmoid_of<float_lanes>(x, y, n); }
void sigmoid(const double* x, double* y, std::int64_t n) { sigmoid_of<double_lanes>(x, y, n); }
void gelu(const double* x, double* y, std::int64_t n) { gelu_of<double_lanes>(x, y, n); }
void gelu_backward(const double* grad, const double* x, double* y, std::int64_t n) {
  gelu_backward_of<double_lanes>(grad, x, y, n);
}
void gelu_tanh_with_exp(const float* x, float* y, std::int64_t n) { gelu_tanh_of<float_lanes>(x, y, n); }
void gelu_tanh_backward_with_exp(const float* grad, const float* x, float* y, std::int64_t n) {
  gelu_tanh_backward_of<float_lanes>(grad, x, y, n);
}
void gelu_tanh(const double* x, double* y, std::int64_t n) { gelu_tanh_of<double_lanes>(x, y, n); }
void gelu_tanh_backward(const double* grad, const double* x, double* y, std::int64_t n) {
  gelu_tanh_backward_of<double_lanes>(grad, x, y, n);
}

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

} // namespace

void to_bfloat16(const float* x, std::uint16_t* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    to_bfloat16_16(x + i, y + i);
  if (i == n)
    return;
  float in[16] = {};
  std::uint16_t out[16];
  for (std::int64_t k = 0; k < n - i; ++k)
    in[k] = x[i + k];
  to_bfloat16_16(in, out);
  for (std::int64_t k = 0; k < n - i; ++k)
    y[i + k] = out[k];
}

void from_bfloat16(const std::uint16_t* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    from_bfloat16_8(x + i, y + i);
  if (i == n)
    return;
  std::uint16_t in[8] = {};
  float out[8];
  for (std::int64_t k = 0; k < n - i; ++k)
    in[k] = x[i + k];
  from_bfloat16_8(in, out);
  for (std::int64_t k = 0; k < n - i; ++k)
    y[i + k] = out[k];
}

} // namespace troupe::detail::vector_math
