#pragma once
// Private: the launchers of the CUDA elementwise kernels (cuda_kernels.cu).
// Plain C++ without troupe or fmt headers, so that nvcc compiles only the
// kernels; cuda_backend.cpp turns tensors into these descriptions.
//
// Every kernel walks the index space of `shape` in row-major order with a
// grid-stride loop. Each operand is a base pointer (the tensor's first
// element) and element strides over that shape, so views and stride-0
// broadcasts need no copy; when every operand is contiguous the offsets are
// the linear index itself.
#include <cstdint>

#include <cuda_runtime_api.h>

namespace troupe::detail::cuda {

/// Ranks above this are a usage_error in cuda_backend.cpp.
inline constexpr int max_rank = 8;

/// Element types by their troupe::dtype wire values (dtype.hpp: never
/// renumbered), so this header needs no troupe header.
enum class element : std::uint8_t { float32 = 0, float64 = 1, int64 = 2, int32 = 3, uint8 = 4, bfloat16 = 5 };

/// Mirrors troupe::unary_op and troupe::binary_op (backend.hpp); the
/// backend checks the correspondence with static_asserts.
enum class unary_kernel : std::uint8_t {
  neg, abs, add_scalar, mul_scalar, pow, exp, log, tanh, sqrt, relu, gelu, sigmoid,
};
enum class binary_kernel : std::uint8_t {
  add, sub, mul, div, maximum, greater, relu_backward, gelu_backward, sigmoid_backward, tanh_backward,
};

struct index_space {
  int rank = 0;
  std::int64_t sizes[max_rank] = {};
  std::int64_t numel = 0;
  /// Every operand is contiguous: offsets are the linear index.
  bool contiguous = false;
};

struct operand {
  void* data = nullptr; ///< the first element of the view
  element type = element::float32;
  std::int64_t strides[max_rank] = {};
};

/// out = value (converted to out's type).
void launch_fill(const index_space& shape, const operand& out, double value, cudaStream_t stream);
/// out = in, converted between any two element types as the CPU does
/// (bfloat16 through float32, rounding to nearest even).
void launch_copy(const index_space& shape, const operand& out, const operand& in, cudaStream_t stream);
/// out = op(a, scalar); float32, float64, int64 and int32 (the floating
/// functions only for float32 and float64, as the ops check).
void launch_unary(unary_kernel op, const index_space& shape, const operand& out, const operand& a,
                  double scalar, cudaStream_t stream);
/// out = op(a, b); same types as launch_unary.
void launch_binary(binary_kernel op, const index_space& shape, const operand& out, const operand& a,
                   const operand& b, cudaStream_t stream);
/// a += alpha * b (a + b when alpha == 1, as the CPU computes it).
void launch_axpy(const index_space& shape, const operand& a, const operand& b, double alpha,
                 cudaStream_t stream);
/// out = cond != 0 ? a : b; cond of any type.
void launch_where(const index_space& shape, const operand& out, const operand& cond, const operand& a,
                  const operand& b, cudaStream_t stream);

} // namespace troupe::detail::cuda
