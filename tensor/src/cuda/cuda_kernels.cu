// The CUDA elementwise kernels (cuda_kernels.hpp): fill, copy with dtype
// conversion, unary and binary functions, axpy and where. Each mirrors the
// CPU kernel of the same name (cpu_elementwise.cpp, tensor.cpp) so that the
// op-conformance test (tests/tensor/cuda_backend_test.cpp) can compare them
// within float tolerance.
#include <cstdint>
#include <type_traits>

#include "cuda_device_common.cuh"

namespace troupe::detail::cuda {

namespace {

template <class T>
__global__ void fill_kernel(const __grid_constant__ index_space shape, const __grid_constant__ operand out,
                            double value) {
  const T v = convert<T>(value);
  TROUPE_FOR_EACH_INDEX(i, shape)
  at<T>(out, offset_of(i, shape, out)) = v;
}

template <class D, class S>
__global__ void copy_kernel(const __grid_constant__ index_space shape, const __grid_constant__ operand out,
                            const __grid_constant__ operand in) {
  TROUPE_FOR_EACH_INDEX(i, shape)
  at<D>(out, offset_of(i, shape, out)) = convert<D>(at<S>(in, offset_of(i, shape, in)));
}

template <class T> __device__ inline T erf_of(T x) {
  if constexpr (std::is_same_v<T, float>)
    return erff(x);
  else
    return erf(x);
}

constexpr double sqrt1_2 = 0.70710678118654752440;     // sqrt(2) / 2
constexpr double inv_sqrt_2pi = 0.39894228040143267794; // 1 / sqrt(2 pi)
constexpr double sqrt_2_over_pi = 0.79788456080286535588; // sqrt(2 / pi)

/// GELU's tanh approximation's 0.5 (1 + tanh(u)) as s = sigmoid(2 u) = 1 /
/// (1 + e), e = exp(-2 u), u = sqrt(2 / pi) (x + 0.044715 x^3), and 1 - s
/// as e s where it would cancel: the CPU's formula.
template <class T> struct gelu_tanh_gates {
  T s;
  T one_minus_s;
};

template <class T> __device__ inline gelu_tanh_gates<T> gelu_tanh_gate(T x) {
  const T e = exp_of(T(-2 * sqrt_2_over_pi) * x * (T(1) + T(0.044715) * x * x));
  const T s = T(1) / (T(1) + e);
  return {s, e < T(1) ? e * s : T(1) - s};
}

template <class T> __device__ inline T unary_value(unary_kernel op, T x, T s) {
  switch (op) {
    case unary_kernel::neg: return T(-x);
    case unary_kernel::abs: return x < T(0) ? T(-x) : x;
    case unary_kernel::add_scalar: return T(x + s);
    case unary_kernel::mul_scalar: return T(x * s);
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case unary_kernel::pow:
        if constexpr (std::is_same_v<T, float>)
          return powf(x, s);
        else
          return pow(x, s);
      case unary_kernel::exp: return exp_of(x);
      case unary_kernel::log:
        if constexpr (std::is_same_v<T, float>)
          return logf(x);
        else
          return log(x);
      case unary_kernel::tanh:
        if constexpr (std::is_same_v<T, float>)
          return tanhf(x);
        else
          return tanh(x);
      case unary_kernel::sqrt:
        if constexpr (std::is_same_v<T, float>)
          return sqrtf(x);
        else
          return sqrt(x);
      case unary_kernel::relu: return x > T(0) ? x : T(0);
      case unary_kernel::gelu: return T(0.5) * x * (T(1) + erf_of(x * T(sqrt1_2)));
      case unary_kernel::sigmoid: return T(1) / (T(1) + exp_of(-x));
      case unary_kernel::gelu_tanh: return x * gelu_tanh_gate(x).s;
      default: break;
    }
  }
  return T(0); // unreachable: the ops check dtypes before a kernel runs
}

template <class T> __device__ inline T gelu_derivative(T x) {
  const T cdf = T(0.5) * (T(1) + erf_of(x * T(sqrt1_2)));
  const T pdf = exp_of(T(-0.5) * x * x) * T(inv_sqrt_2pi);
  return cdf + x * pdf;
}

template <class T> __device__ inline T gelu_tanh_derivative(T x) {
  const auto g = gelu_tanh_gate(x);
  return g.s + x * (g.s * g.one_minus_s) * ((T(1) + T(3 * 0.044715) * x * x) * T(2 * sqrt_2_over_pi));
}

template <class T> __device__ inline T binary_value(binary_kernel op, T x, T y) {
  switch (op) {
    case binary_kernel::add: return T(x + y);
    case binary_kernel::sub: return T(x - y);
    case binary_kernel::mul: return T(x * y);
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case binary_kernel::div: return x / y;
      case binary_kernel::maximum: return (x > y || x != x) ? x : y; // NaN propagates
      case binary_kernel::greater: return x > y ? T(1) : T(0);
      case binary_kernel::relu_backward: return y > T(0) ? x : T(0);
      case binary_kernel::gelu_backward: return x * gelu_derivative(y);
      case binary_kernel::sigmoid_backward: return x * y * (T(1) - y);
      case binary_kernel::tanh_backward: return x * (T(1) - y * y);
      case binary_kernel::gelu_tanh_backward: return x * gelu_tanh_derivative(y);
      default: break;
    }
  }
  return T(0); // unreachable, as above
}

template <class T>
__global__ void unary_kernel_of(unary_kernel op, const __grid_constant__ index_space shape,
                                const __grid_constant__ operand out, const __grid_constant__ operand a, double scalar) {
  const T s = static_cast<T>(scalar);
  TROUPE_FOR_EACH_INDEX(i, shape)
  at<T>(out, offset_of(i, shape, out)) = unary_value<T>(op, at<T>(a, offset_of(i, shape, a)), s);
}

template <class T>
__global__ void binary_kernel_of(binary_kernel op, const __grid_constant__ index_space shape,
                                 const __grid_constant__ operand out, const __grid_constant__ operand a,
                                 const __grid_constant__ operand b) {
  TROUPE_FOR_EACH_INDEX(i, shape)
  at<T>(out, offset_of(i, shape, out)) =
    binary_value<T>(op, at<T>(a, offset_of(i, shape, a)), at<T>(b, offset_of(i, shape, b)));
}

template <class T>
__global__ void axpy_kernel(const __grid_constant__ index_space shape, const __grid_constant__ operand a,
                            const __grid_constant__ operand b, double alpha) {
  const T s = static_cast<T>(alpha);
  const bool plain = alpha == 1.0;
  TROUPE_FOR_EACH_INDEX(i, shape) {
    T& x = at<T>(a, offset_of(i, shape, a));
    const T y = at<T>(b, offset_of(i, shape, b));
    x = plain ? T(x + y) : T(x + s * y);
  }
}

template <class T, class C>
__global__ void where_kernel(const __grid_constant__ index_space shape, const __grid_constant__ operand out,
                             const __grid_constant__ operand cond, const __grid_constant__ operand a,
                             const __grid_constant__ operand b) {
  TROUPE_FOR_EACH_INDEX(i, shape) {
    const bool pick = convert<double>(at<C>(cond, offset_of(i, shape, cond))) != 0.0;
    at<T>(out, offset_of(i, shape, out)) =
      pick ? at<T>(a, offset_of(i, shape, a)) : at<T>(b, offset_of(i, shape, b));
  }
}

} // namespace

void launch_fill(const index_space& shape, const operand& out, double value, cudaStream_t stream) {
  dispatch_any(out.type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch(fill_kernel<T>, shape, stream, shape, out, value);
  });
}

void launch_copy(const index_space& shape, const operand& out, const operand& in, cudaStream_t stream) {
  dispatch_any(out.type, [&](auto d) {
    using D = typename decltype(d)::type;
    dispatch_any(in.type, [&](auto s) {
      using S = typename decltype(s)::type;
      launch(copy_kernel<D, S>, shape, stream, shape, out, in);
    });
  });
}

void launch_unary(unary_kernel op, const index_space& shape, const operand& out, const operand& a,
                  double scalar, cudaStream_t stream) {
  dispatch_arithmetic(out.type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch(unary_kernel_of<T>, shape, stream, op, shape, out, a, scalar);
  });
}

void launch_binary(binary_kernel op, const index_space& shape, const operand& out, const operand& a,
                   const operand& b, cudaStream_t stream) {
  dispatch_arithmetic(out.type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch(binary_kernel_of<T>, shape, stream, op, shape, out, a, b);
  });
}

void launch_axpy(const index_space& shape, const operand& a, const operand& b, double alpha,
                 cudaStream_t stream) {
  dispatch_arithmetic(a.type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch(axpy_kernel<T>, shape, stream, shape, a, b, alpha);
  });
}

void launch_where(const index_space& shape, const operand& out, const operand& cond, const operand& a,
                  const operand& b, cudaStream_t stream) {
  dispatch_arithmetic(out.type, [&](auto t) {
    using T = typename decltype(t)::type;
    dispatch_any(cond.type, [&](auto c) {
      using C = typename decltype(c)::type;
      launch(where_kernel<T, C>, shape, stream, shape, out, cond, a, b);
    });
  });
}

} // namespace troupe::detail::cuda
