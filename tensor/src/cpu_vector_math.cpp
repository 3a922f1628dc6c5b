// SLEEF's vector functions over contiguous arrays (cpu_vector_math.hpp);
// float32 GELU is oneDNN's (cpu_onednn_gelu.cpp).
//
// Compiled twice (tensor/CMakeLists.txt): with -mavx2 -mfma into
// vector_math::avx2 and with AVX-512 into vector_math::avx512, the lanes of
// cpu_vector_lanes.hpp following; cpu_vector_dispatch.cpp runs one of them
// once vector_math::available() said so. cpu_vector_lanes.hpp says why
// it includes no C++ standard header.
#include "cpu_vector_math.hpp"

#include "cpu_vector_lanes.hpp"

#ifndef TROUPE_VECTOR_ISA
#error "tensor/CMakeLists.txt compiles this file once per instruction set and names it in TROUPE_VECTOR_ISA"
#endif

namespace troupe::detail::vector_math::TROUPE_VECTOR_ISA {

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
void gelu_tanh_with_exp(const float* x, float* y, std::int64_t n) { gelu_tanh_of<float_lanes>(x, y, n); }
void gelu_tanh_backward_with_exp(const float* grad, const float* x, float* y, std::int64_t n) {
  gelu_tanh_backward_of<float_lanes>(grad, x, y, n);
}
void gelu_tanh(const double* x, double* y, std::int64_t n) { gelu_tanh_of<double_lanes>(x, y, n); }
void gelu_tanh_backward(const double* grad, const double* x, double* y, std::int64_t n) {
  gelu_tanh_backward_of<double_lanes>(grad, x, y, n);
}

} // namespace troupe::detail::vector_math::TROUPE_VECTOR_ISA
