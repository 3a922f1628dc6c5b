// SLEEF's AVX2 vector functions over contiguous arrays (cpu_vector_math.hpp);
// float32 GELU is oneDNN's (cpu_onednn_gelu.cpp).
//
// This file alone is compiled with -mavx2 -mfma (tensor/CMakeLists.txt), and
// its functions run only once vector_math::available() (in
// cpu_elementwise.cpp) said the CPU has both. It includes no C++ standard
// header, so no inline function shared with other translation units gets an
// AVX2 copy that the linker might keep for a CPU without it.
#include "cpu_vector_math.hpp"

#include <immintrin.h>
#include <sleef.h>

namespace troupe::detail::vector_math {

namespace {

struct float_lanes {
  using scalar = float;
  using vector = __m256;
  static constexpr int width = 8;
  static vector load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, vector v) { _mm256_storeu_ps(p, v); }
  static vector splat(float v) { return _mm256_set1_ps(v); }
  static vector add(vector a, vector b) { return _mm256_add_ps(a, b); }
  static vector mul(vector a, vector b) { return _mm256_mul_ps(a, b); }
  static vector div(vector a, vector b) { return _mm256_div_ps(a, b); }
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
  static vector mul(vector a, vector b) { return _mm256_mul_pd(a, b); }
  static vector div(vector a, vector b) { return _mm256_div_pd(a, b); }
  static vector exp(vector v) { return Sleef_expd4_u10avx2(v); }
  static vector tanh(vector v) { return Sleef_tanhd4_u10avx2(v); }
  static vector erf(vector v) { return Sleef_erfd4_u10avx2(v); }
};

/// y[i] = f(x[i], z[i]) a vector at a time; the last partial vector goes
/// through f too, padded with zeros.
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

} // namespace

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

} // namespace troupe::detail::vector_math
