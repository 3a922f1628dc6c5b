// SLEEF's AVX2 vector functions over contiguous arrays (cpu_vector_math.hpp);
// float32 GELU is oneDNN's (cpu_onednn_gelu.cpp).
//
// This file is compiled with -mavx2 -mfma (tensor/CMakeLists.txt), and its
// functions run only once vector_math::available() (in cpu_elementwise.cpp)
// said the CPU has both; cpu_vector_lanes.hpp says why it includes no C++
// standard header.
#include "cpu_vector_math.hpp"

#include "cpu_vector_lanes.hpp"

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
