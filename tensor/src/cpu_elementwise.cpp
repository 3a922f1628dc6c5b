// CPU elementwise kernels: a flat loop the compiler vectorises when every
// operand is contiguous, and a row-wise strided loop (for_each_row) for
// views and broadcasts. exp, tanh, sigmoid, GELU and its gradient go to
// the vector functions of cpu_vector_math.hpp (SLEEF; oneDNN for float32
// GELU) where the CPU has them, strided operands row by row: the compiler
// cannot vectorise glibc's calls.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <type_traits>

#include "cpu_backend.hpp"
#include "cpu_vector_math.hpp"
#include "dispatch.hpp"
#include "troupe/tensor/parallel_for.hpp"

namespace troupe::detail {

namespace {

// Elements per intra-op range: a thread's wake-up costs about what 32K
// additions do, and about what 4K transcendental functions do. Ranges start
// on multiples of 64 elements (whole cache lines and vectors).
constexpr std::int64_t cheap_grain = 32768;
constexpr std::int64_t vector_math_grain = 4096;
constexpr std::int64_t range_align = 64;

template <class T, class F> void map1(const tensor& a, tensor& out, F f) {
  const T* x = base_of<T>(a);
  T* y = base_of<T>(out);
  if (a.is_contiguous() && out.is_contiguous()) {
    x += a.offset();
    y += out.offset();
    // The pointers by value: through a reference the stores could alias
    // them, which kept the loop scalar.
    parallel_for(
        out.numel(), cheap_grain,
        [x, y, f](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i)
            y[i] = f(x[i]);
        },
        range_align);
    return;
  }
  for_each_row<2>(out.shape(), {&out.strides(), &a.strides()}, {out.offset(), a.offset()},
                  [&](auto off, std::int64_t n, auto step) {
                    T* yr = y + off[0];
                    const T* xr = x + off[1];
                    for (std::int64_t i = 0; i < n; ++i)
                      yr[i * step[0]] = f(xr[i * step[1]]);
                  });
}

template <class T, class F> void map2(const tensor& a, const tensor& b, tensor& out, F f) {
  const T* x = base_of<T>(a);
  const T* z = base_of<T>(b);
  T* y = base_of<T>(out);
  if (a.is_contiguous() && b.is_contiguous() && out.is_contiguous()) {
    x += a.offset();
    z += b.offset();
    y += out.offset();
    parallel_for(
        out.numel(), cheap_grain,
        [x, z, y, f](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i)
            y[i] = f(x[i], z[i]);
        },
        range_align);
    return;
  }
  for_each_row<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()},
                  {out.offset(), a.offset(), b.offset()},
                  [&](auto off, std::int64_t n, auto step) {
                    T* yr = y + off[0];
                    const T* xr = x + off[1];
                    const T* zr = z + off[2];
                    if (step[0] == 1 && step[1] == 1 && step[2] == 1) {
                      for (std::int64_t i = 0; i < n; ++i)
                        yr[i] = f(xr[i], zr[i]);
                    } else if (step[0] == 1 && step[1] == 1 && step[2] == 0) {
                      // Row-vector broadcast (bias add), the common strided case.
                      const T s = *zr;
                      for (std::int64_t i = 0; i < n; ++i)
                        yr[i] = f(xr[i], s);
                    } else {
                      for (std::int64_t i = 0; i < n; ++i)
                        yr[i * step[0]] = f(xr[i * step[1]], zr[i * step[2]]);
                    }
                  });
}

/// Runs the array function f(x, y, n) of cpu_vector_math.hpp over `a`
/// into `out` when the CPU has it (false when it does not): in one call
/// when both are contiguous, else row by row through a small buffer, so an
/// element's result never depends on the layout.
template <class T, class F> bool vectorized1(const tensor& a, tensor& out, F f) {
  if (!vector_math::available())
    return false;
  const T* x = base_of<T>(a);
  T* y = base_of<T>(out);
  if (a.is_contiguous() && out.is_contiguous()) {
    x += a.offset();
    y += out.offset();
    parallel_for(
        out.numel(), vector_math_grain,
        [&](std::int64_t begin, std::int64_t end) { f(x + begin, y + begin, end - begin); }, range_align);
    return true;
  }
  constexpr std::int64_t chunk = 256;
  for_each_row<2>(out.shape(), {&out.strides(), &a.strides()}, {out.offset(), a.offset()},
                  [&](auto off, std::int64_t n, auto step) {
                    T in[chunk];
                    T result[chunk];
                    for (std::int64_t start = 0; start < n; start += chunk) {
                      const auto m = std::min(chunk, n - start);
                      for (std::int64_t i = 0; i < m; ++i)
                        in[i] = x[off[1] + (start + i) * step[1]];
                      f(in, result, m);
                      for (std::int64_t i = 0; i < m; ++i)
                        y[off[0] + (start + i) * step[0]] = result[i];
                    }
                  });
  return true;
}

/// The same for an array function of two operands, f(a, b, y, n).
template <class T, class F> bool vectorized2(const tensor& a, const tensor& b, tensor& out, F f) {
  if (!vector_math::available())
    return false;
  const T* x = base_of<T>(a);
  const T* z = base_of<T>(b);
  T* y = base_of<T>(out);
  if (a.is_contiguous() && b.is_contiguous() && out.is_contiguous()) {
    x += a.offset();
    z += b.offset();
    y += out.offset();
    parallel_for(
        out.numel(), vector_math_grain,
        [&](std::int64_t begin, std::int64_t end) { f(x + begin, z + begin, y + begin, end - begin); }, range_align);
    return true;
  }
  constexpr std::int64_t chunk = 256;
  for_each_row<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()}, {out.offset(), a.offset(), b.offset()},
                  [&](auto off, std::int64_t n, auto step) {
                    T first[chunk];
                    T second[chunk];
                    T result[chunk];
                    for (std::int64_t start = 0; start < n; start += chunk) {
                      const auto m = std::min(chunk, n - start);
                      for (std::int64_t i = 0; i < m; ++i) {
                        first[i] = x[off[1] + (start + i) * step[1]];
                        second[i] = z[off[2] + (start + i) * step[2]];
                      }
                      f(first, second, result, m);
                      for (std::int64_t i = 0; i < m; ++i)
                        y[off[0] + (start + i) * step[0]] = result[i];
                    }
                  });
  return true;
}

template <class T> T gelu_of(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
}

template <class T> T gelu_derivative(T x) {
  // d/dx x * Phi(x) = Phi(x) + x * phi(x).
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(std::numbers::sqrt2 / 2)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(std::numbers::inv_sqrtpi / std::numbers::sqrt2);
  return cdf + x * pdf;
}

/// GELU's tanh approximation as x s, s = sigmoid(2 u) = 1 / (1 + e), e =
/// exp(-2 u), u = sqrt(2 / pi) (x + 0.044715 x^3): the vector path's
/// formula (cpu_vector_math.cpp), 1 - s taken as e s where it would cancel.
template <class T> struct gelu_tanh_gates {
  T s;
  T one_minus_s;
};

template <class T> gelu_tanh_gates<T> gelu_tanh_gate(T x) {
  constexpr T minus_2k = T(-2 * std::numbers::sqrt2 * std::numbers::inv_sqrtpi);
  const T e = std::exp(minus_2k * x * (T(1) + T(0.044715) * x * x));
  const T s = T(1) / (T(1) + e);
  return {s, e < T(1) ? e * s : T(1) - s};
}

template <class T> T gelu_tanh_derivative(T x) {
  constexpr T two_k = T(2 * std::numbers::sqrt2 * std::numbers::inv_sqrtpi);
  const auto g = gelu_tanh_gate(x);
  return g.s + x * (g.s * g.one_minus_s) * ((T(1) + T(3 * 0.044715) * x * x) * two_k);
}

} // namespace

void cpu_backend::unary(unary_op op, const tensor& a, double scalar, tensor& out) {
  dispatch_arithmetic(out.type(), "cpu elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = static_cast<T>(scalar);
    switch (op) {
      case unary_op::neg: return map1<T>(a, out, [](T x) { return T(-x); });
      case unary_op::abs: return map1<T>(a, out, [](T x) { return x < T(0) ? T(-x) : x; });
      case unary_op::add_scalar: return map1<T>(a, out, [s](T x) { return T(x + s); });
      case unary_op::mul_scalar: return map1<T>(a, out, [s](T x) { return T(x * s); });
      default: break;
    }
    if constexpr (std::is_floating_point_v<T>) {
      switch (op) {
        case unary_op::pow: return map1<T>(a, out, [s](T x) { return std::pow(x, s); });
        case unary_op::exp:
          if (vectorized1<T>(a, out, [](auto... args) { vector_math::exp(args...); }))
            return;
          return map1<T>(a, out, [](T x) { return std::exp(x); });
        case unary_op::log: return map1<T>(a, out, [](T x) { return std::log(x); });
        case unary_op::tanh:
          if (vectorized1<T>(a, out, [](auto... args) { vector_math::tanh(args...); }))
            return;
          return map1<T>(a, out, [](T x) { return std::tanh(x); });
        case unary_op::sqrt: return map1<T>(a, out, [](T x) { return std::sqrt(x); });
        case unary_op::relu: return map1<T>(a, out, [](T x) { return x > T(0) ? x : T(0); });
        case unary_op::gelu:
          if (vectorized1<T>(a, out, [](auto... args) { vector_math::gelu(args...); }))
            return;
          return map1<T>(a, out, [](T x) { return gelu_of(x); });
        case unary_op::sigmoid:
          if (vectorized1<T>(a, out, [](auto... args) { vector_math::sigmoid(args...); }))
            return;
          return map1<T>(a, out, [](T x) { return T(1) / (T(1) + std::exp(-x)); });
        case unary_op::gelu_tanh:
          if (vectorized1<T>(a, out, [](auto... args) { vector_math::gelu_tanh(args...); }))
            return;
          return map1<T>(a, out, [](T x) { return x * gelu_tanh_gate(x).s; });
        default: break;
      }
    }
    TROUPE_ASSERT(false, "cpu unary: op {} not defined for {}", static_cast<int>(op), out.type());
  });
}

void cpu_backend::binary(binary_op op, const tensor& a, const tensor& b, tensor& out) {
  dispatch_arithmetic(out.type(), "cpu elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case binary_op::add: return map2<T>(a, b, out, [](T x, T y) { return T(x + y); });
      case binary_op::sub: return map2<T>(a, b, out, [](T x, T y) { return T(x - y); });
      case binary_op::mul: return map2<T>(a, b, out, [](T x, T y) { return T(x * y); });
      default: break;
    }
    if constexpr (std::is_floating_point_v<T>) {
      switch (op) {
        case binary_op::div: return map2<T>(a, b, out, [](T x, T y) { return x / y; });
        case binary_op::maximum:
          // NaN propagates, as in torch.maximum.
          return map2<T>(a, b, out, [](T x, T y) { return (x > y || std::isnan(x)) ? x : y; });
        case binary_op::greater:
          return map2<T>(a, b, out, [](T x, T y) { return x > y ? T(1) : T(0); });
        case binary_op::relu_backward:
          return map2<T>(a, b, out, [](T g, T x) { return x > T(0) ? g : T(0); });
        case binary_op::gelu_backward:
          if (vectorized2<T>(a, b, out, [](auto... args) { vector_math::gelu_backward(args...); }))
            return;
          return map2<T>(a, b, out, [](T g, T x) { return g * gelu_derivative(x); });
        case binary_op::sigmoid_backward:
          return map2<T>(a, b, out, [](T g, T y) { return g * y * (T(1) - y); });
        case binary_op::tanh_backward:
          return map2<T>(a, b, out, [](T g, T y) { return g * (T(1) - y * y); });
        case binary_op::gelu_tanh_backward:
          if (vectorized2<T>(a, b, out, [](auto... args) { vector_math::gelu_tanh_backward(args...); }))
            return;
          return map2<T>(a, b, out, [](T g, T x) { return g * gelu_tanh_derivative(x); });
        default: break;
      }
    }
    TROUPE_ASSERT(false, "cpu binary: op {} not defined for {}", static_cast<int>(op), out.type());
  });
}

void cpu_backend::axpy(tensor& a, const tensor& b, double alpha) {
  dispatch_arithmetic(a.type(), "cpu elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T s = static_cast<T>(alpha);
    if (alpha == 1.0)
      map2<T>(a, b, a, [](T x, T y) { return T(x + y); });
    else
      map2<T>(a, b, a, [s](T x, T y) { return T(x + s * y); });
  });
}

void cpu_backend::where(const tensor& cond, const tensor& a, const tensor& b, tensor& out) {
  dispatch_arithmetic(out.type(), "cpu elementwise", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_any(cond.type(), [&](auto cond_tag) {
      using C = typename decltype(cond_tag)::type;
      const C* c = base_of<C>(cond);
      const T* x = base_of<T>(a);
      const T* z = base_of<T>(b);
      T* y = base_of<T>(out);
      for_each_row<4>(out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()},
                      {out.offset(), cond.offset(), a.offset(), b.offset()},
                      [&](auto off, std::int64_t n, auto step) {
                        for (std::int64_t i = 0; i < n; ++i) {
                          const bool pick = convert<double>(c[off[1] + i * step[1]]) != 0.0;
                          y[off[0] + i * step[0]] =
                              pick ? x[off[2] + i * step[2]] : z[off[3] + i * step[3]];
                        }
                      });
    });
  });
}

} // namespace troupe::detail
