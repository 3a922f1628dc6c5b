#pragma once
// Private: the transcendental elementwise functions of the CPU backend over
// contiguous arrays, with SLEEF's vector functions (the vector math PyTorch
// uses; 1.0-ulp variants) when this CPU has AVX2 and FMA, chosen at run
// time; float32 GELU (exact and tanh) and its gradient with oneDNN's
// eltwise kernels, which are about ten times faster than SLEEF's erf
// (cpu_onednn_gelu.cpp). glibc's scalar erff costs 2.2 ns per element for
// small inputs and 11-13 ns once GELU's inputs grow during training;
// SLEEF's is branch-free. The row kernels below (softmax, cross-entropy,
// layer norm) are hand-written AVX2 loops around SLEEF's exp.
//
// Every element goes through the vector function, the last partial vector
// too (padded), so an element's result never depends on its position or on
// the array's length: a micro-batch computes what the whole batch does.
//
// Call them only when available() says so (cpu_vector_math.cpp is compiled
// for AVX2 and FMA); otherwise the caller runs its scalar loop.
#include <cstdint>

namespace troupe::detail::vector_math {

/// Whether the vector functions run on this CPU (AVX2 and FMA) and are not
/// switched off (TROUPE_VECTOR_MATH=off). Defined in cpu_elementwise.cpp,
/// which is compiled for any x86-64.
bool available() noexcept;

void exp(const float* x, float* y, std::int64_t n);
void exp(const double* x, double* y, std::int64_t n);
void tanh(const float* x, float* y, std::int64_t n);
void tanh(const double* x, double* y, std::int64_t n);
/// 1 / (1 + exp(-x)).
void sigmoid(const float* x, float* y, std::int64_t n);
void sigmoid(const double* x, double* y, std::int64_t n);
/// x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) (the exact GELU).
void gelu(const float* x, float* y, std::int64_t n);
void gelu(const double* x, double* y, std::int64_t n);
/// grad * (Phi(x) + x phi(x)).
void gelu_backward(const float* grad, const float* x, float* y, std::int64_t n);
void gelu_backward(const double* grad, const double* x, double* y, std::int64_t n);
/// The tanh approximation 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x +
/// 0.044715 x^3), as x sigmoid(2 u) (the same function) with the vector
/// exp. float32 goes to oneDNN's gelu_tanh where oneDNN runs AVX-512 (half
/// the time of the exp form in bench/ops there); its AVX2 kernel took
/// three times the exp form's time on an AMD EPYC, so elsewhere float32
/// takes the exp form too (cpu_onednn_gelu.cpp chooses, by the CPU alone,
/// so every process of a job computes the same bits).
void gelu_tanh(const float* x, float* y, std::int64_t n);
void gelu_tanh_with_exp(const float* x, float* y, std::int64_t n);
void gelu_tanh_backward_with_exp(const float* grad, const float* x, float* y, std::int64_t n);
void gelu_tanh(const double* x, double* y, std::int64_t n);
/// grad * d/dx of gelu_tanh.
void gelu_tanh_backward(const float* grad, const float* x, float* y, std::int64_t n);
void gelu_tanh_backward(const double* grad, const double* x, double* y, std::int64_t n);

/// The first two words of Philox 4x32-10 (philox.hpp: philox_at) for the
/// counters start, start + 1, ..., start + n - 1 of `seed`, eight at a
/// time: w0[i], and w1[i] unless w1 is null. The same bits as philox_at.
void philox_words(std::uint64_t seed, std::uint64_t start, std::int64_t n, std::uint32_t* w0, std::uint32_t* w1);

// -- row kernels (cpu_vector_rows.cpp) over `rows` contiguous rows of n >= 1 ----
//
// A row's sums run lane-wise in blocks of 128 elements, so their order
// depends only on n; the exponentials are the exp above.

/// y = softmax(x) of each row, or log-softmax when `log`.
void softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t n, bool log);
void softmax_rows(const double* x, double* y, std::int64_t rows, std::int64_t n, bool log);
/// dx from dL/dy `grad` and y = softmax(x) (log: y = log-softmax(x)).
void softmax_backward_rows(const float* grad, const float* y, float* dx, std::int64_t rows, std::int64_t n,
                           bool log);
void softmax_backward_rows(const double* grad, const double* y, double* dx, std::int64_t rows, std::int64_t n,
                           bool log);
/// Causal softmax of rows of [queries, n] matrices: row r keeps its first
/// min(r % queries + 1, n) elements, y = softmax(scale x) over them (scale
/// > 0) and 0 after them.
void causal_softmax_rows(const float* x, float* y, std::int64_t rows, std::int64_t queries, std::int64_t n,
                         float scale);
void causal_softmax_rows(const double* x, double* y, std::int64_t rows, std::int64_t queries, std::int64_t n,
                         double scale);
/// dx from dL/dy `grad` and y = causal_softmax_rows(x): scale y (g - <g, y>)
/// over the kept prefix, 0 after it.
void causal_softmax_backward_rows(const float* grad, const float* y, float* dx, std::int64_t rows,
                                  std::int64_t queries, std::int64_t n, float scale);
void causal_softmax_backward_rows(const double* grad, const double* y, double* dx, std::int64_t rows,
                                  std::int64_t queries, std::int64_t n, double scale);
/// One block (n <= 128) of row_sums_side_by_side (cpu_backend.hpp): out[r]
/// = the sum of x[r + i step] over i < n for every r < rows, with row_sum's
/// order and bits. It reads the block a row of x at a time (a bias
/// gradient's rows are whole cache lines in order) into eight lanes of
/// partial sums in `lanes` (8 rows elements of scratch).
void side_by_side_block(const float* x, std::int64_t rows, std::int64_t n, std::int64_t step, float* lanes,
                        float* out);
void side_by_side_block(const double* x, std::int64_t rows, std::int64_t n, std::int64_t step, double* lanes,
                        double* out);
/// lse[r] = log Σ exp(x[r, :]) (max-shifted), for cross-entropy.
void log_sum_exp_rows(const float* x, float* lse, std::int64_t rows, std::int64_t n);
void log_sum_exp_rows(const double* x, double* lse, std::int64_t rows, std::int64_t n);
/// y = exp(x - shift) * scale over one contiguous row of n.
void exp_scaled(const float* x, float shift, float scale, float* y, std::int64_t n);
void exp_scaled(const double* x, double shift, double scale, double* y, std::int64_t n);

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
void layer_norm(const layer_norm_rows<float>& rows);
void layer_norm(const layer_norm_rows<double>& rows);

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
void layer_norm_backward(const layer_norm_backward_rows<float>& rows);
void layer_norm_backward(const layer_norm_backward_rows<double>& rows);

// -- bfloat16 storage (cpu_vector_math.cpp) ----------------------------------

/// y[i] = the bits of bfloat16(x[i]) (dtype.hpp: nearest, ties to even; a
/// NaN stays a quiet NaN), eight at a time, with the scalar rule's bits.
void to_bfloat16(const float* x, std::uint16_t* y, std::int64_t n);
/// y[i] = float(bfloat16 with bits x[i]), exactly.
void from_bfloat16(const std::uint16_t* x, float* y, std::int64_t n);

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
