#pragma once
// Private: the vector kernels of the CPU backend over contiguous arrays.
//
// Elementwise functions use SLEEF's vector functions (the vector math
// PyTorch uses; 1.0-ulp variants); float32 GELU (exact and tanh) and its
// gradient use oneDNN's eltwise kernels, about ten times faster than
// SLEEF's erf (cpu_onednn_gelu.cpp). glibc's scalar erff costs 2.2 ns per
// element for small inputs and 11-13 ns once GELU's inputs grow during
// training; SLEEF's is branch-free. The row kernels (softmax,
// cross-entropy, layer norm) are hand-written loops around SLEEF's exp.
//
// Instruction sets. The kernels of cpu_vector_kernels.inc are written once
// over lanes (cpu_vector_lanes.hpp) and compiled twice: for AVX2 and FMA
// (vector_math::avx2) and for AVX-512 (vector_math::avx512, 16 floats or 8
// doubles a vector). The entry points at vector_math scope run the AVX-512
// copy where the CPU has AVX-512 F, DQ, BW and VL, the AVX2 copy elsewhere
// (TROUPE_VECTOR_MATH=avx2 forces it), chosen once per process from the CPU
// alone. The two agree within rounding: the elementwise functions are
// SLEEF's 1.0-ulp ones in both, and a row's sums run in lanes as wide as
// the vector, so their order differs. Philox, dropout masks and bfloat16
// conversion have an AVX2 and an AVX-512 copy (cpu_vector_bits.cpp,
// cpu_vector_bits_avx512.cpp), exact by construction. The Adam step
// (cpu_vector_optim.cpp) is AVX2 only: exact too, and memory-bound.
//
// Every element goes through the vector function, the last partial vector
// too (padded), so an element's result never depends on its position or on
// the array's length: a micro-batch computes what the whole batch does.
//
// Call them only when available() says so; otherwise the caller runs its
// scalar loop.
#include <cstdint>

namespace troupe::detail::vector_math {

/// Whether the vector functions run on this CPU (AVX2 and FMA) and are not
/// switched off (TROUPE_VECTOR_MATH=off). Both are decided once, in
/// cpu_vector_dispatch.cpp, which is compiled for any x86-64.
bool available() noexcept;
/// Whether the entry points run the AVX-512 copies.
bool avx512_chosen() noexcept;

/// Layer norm of `rows` contiguous rows of d: y = (x - mean) rstd weight +
/// bias (weight and bias [d] or null), with each row's mean and rstd =
/// 1 / sqrt(var + eps) stored.
template <class T> struct layer_norm_rows {
  const T* x = nullptr;
  const T* weight = nullptr;
  const T* bias = nullptr;
  T eps = 0;
  T* y = nullptr;
  T* mean = nullptr;
  T* rstd = nullptr;
  std::int64_t rows = 0;
  std::int64_t d = 0;
};

/// The gradients of layer norm from dL/dy `grad` and the forward's x, mean
/// and rstd: grad_input [rows, d] is written, grad_weight and grad_bias [d]
/// are overwritten with the sums over rows (in row order).
template <class T> struct layer_norm_backward_rows {
  const T* grad = nullptr;
  const T* x = nullptr;
  const T* mean = nullptr;
  const T* rstd = nullptr;
  const T* weight = nullptr; ///< may be null
  T* grad_input = nullptr;
  T* grad_weight = nullptr;
  T* grad_bias = nullptr;
  std::int64_t rows = 0;
  std::int64_t d = 0;
};

#include "cpu_vector_kernels.inc"

/// The kernels compiled for AVX2 and FMA.
namespace avx2 {
#include "cpu_vector_kernels.inc"
} // namespace avx2

/// The kernels compiled for AVX-512 (F, DQ, BW, VL).
namespace avx512 {
#include "cpu_vector_kernels.inc"
} // namespace avx512

// -- oneDNN's float32 GELU (cpu_onednn_gelu.cpp) ---------------------------------

/// The exact GELU and its gradient.
void gelu(const float* x, float* y, std::int64_t n);
void gelu_backward(const float* grad, const float* x, float* y, std::int64_t n);
/// float32 goes to oneDNN's gelu_tanh where oneDNN runs AVX-512 (half the
/// time of the exp form in bench/ops there); its AVX2 kernel took three
/// times the exp form's time on an AMD EPYC, so elsewhere float32 takes the
/// exp form too (cpu_onednn_gelu.cpp chooses, by the CPU alone, so every
/// process of a job computes the same bits).
void gelu_tanh(const float* x, float* y, std::int64_t n);
void gelu_tanh_backward(const float* grad, const float* x, float* y, std::int64_t n);

// -- optimizer steps (cpu_vector_optim.cpp) ----------------------------------

/// One Adam or AdamW step's scalars (backend.hpp's adam_step_args).
struct adam_scalars {
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double step_size = 0;
  double bias_correction2_sqrt = 1;
  double l2 = 0;
  double decay = 1;
};
/// The Adam step of n contiguous elements in double lanes: the operations of
/// cpu_optim.cpp's element loop, in its order and without fused
/// multiply-adds, so every element gets that loop's bits.
void adam_step(float* p, const float* g, float* m, float* v, std::int64_t n, const adam_scalars& s);
void adam_step(double* p, const double* g, double* m, double* v, std::int64_t n, const adam_scalars& s);

} // namespace troupe::detail::vector_math
