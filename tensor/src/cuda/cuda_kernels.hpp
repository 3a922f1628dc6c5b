#pragma once
// Private: the launchers of the CUDA kernels (cuda_kernels.cu: elementwise;
// cuda_reduce.cu: rows, softmax, cross entropy, layer norm; cuda_index.cu:
// indexing and embedding bags; cuda_conv.cu: im2col, col2im, pooling;
// cuda_random.cu: Philox draws; cuda_optim.cu: fused optimizer steps).
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
  neg, abs, add_scalar, mul_scalar, pow, exp, log, tanh, sqrt, relu, gelu, sigmoid, gelu_tanh,
};
enum class binary_kernel : std::uint8_t {
  add, sub, mul, div, maximum, greater, relu_backward, gelu_backward, sigmoid_backward, tanh_backward,
  gelu_tanh_backward,
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

// -- rows: reductions, softmax, cross entropy, layer norm (cuda_reduce.cu) -------------
//
// A row is reduced by one block in a fixed tree order, so a result depends
// only on the row's length and values (deterministic, like the CPU's
// row_sum, though the order of additions differs from it).

/// values[r] = sum or max over a[r, :] of a [rows, cols] view with element
/// strides (row_stride, col_stride); for max, `indices` (int64, may be
/// null) gets the first position of the maximum (a NaN is a maximum).
/// `reduce_max` false means sum. Arithmetic types.
void launch_reduce_rows(bool reduce_max, element type, const void* a, std::int64_t rows, std::int64_t cols,
                        std::int64_t row_stride, std::int64_t col_stride, void* values, std::int64_t* indices,
                        cudaStream_t stream);
/// Row-wise (log-)softmax of contiguous [rows, cols]; float32/float64.
void launch_softmax(element type, const void* a, std::int64_t rows, std::int64_t cols, bool log, void* out,
                    cudaStream_t stream);
/// dL/dx of (log-)softmax from contiguous dL/dy and y.
void launch_softmax_backward(element type, const void* grad, const void* output, std::int64_t rows,
                             std::int64_t cols, bool log, void* out, cudaStream_t stream);
/// Causal softmax of contiguous scores [rows, cols], rows being whole
/// [queries, cols] matrices: row r keeps its first min(r % queries + 1,
/// cols) columns, y = softmax(scale x) there and 0 under the mask.
void launch_causal_softmax(element type, const void* a, std::int64_t rows, std::int64_t queries, std::int64_t cols,
                           double scale, void* out, cudaStream_t stream);
/// dL/dx of the causal softmax from contiguous dL/dy and y; `out` may be `grad`.
void launch_causal_softmax_backward(element type, const void* grad, const void* output, std::int64_t rows,
                                    std::int64_t queries, std::int64_t cols, double scale, void* out,
                                    cudaStream_t stream);
/// Mean cross entropy of contiguous logits [rows, cols] against int64
/// targets (element stride target_step, validated on the host): each row's
/// log Σ exp into log_sum_exp [rows], the mean into the scalar `loss`.
void launch_cross_entropy(element type, const void* logits, const std::int64_t* targets, std::int64_t target_step,
                          std::int64_t rows, std::int64_t cols, void* loss, void* log_sum_exp, cudaStream_t stream);
/// out = grad (exp(logits - lse) - onehot(targets)) / rows, `grad` the
/// scalar upstream gradient on the device, log_sum_exp with element stride
/// lse_step.
void launch_cross_entropy_backward(element type, const void* grad, const void* logits, const std::int64_t* targets,
                                   std::int64_t target_step, const void* log_sum_exp, std::int64_t lse_step,
                                   std::int64_t rows, std::int64_t cols, void* out, cudaStream_t stream);
/// Layer norm of contiguous [rows, d]; weight, bias may be null.
void launch_layer_norm(element type, const void* input, const void* weight, const void* bias, std::int64_t rows,
                       std::int64_t d, double eps, void* output, void* mean, void* rstd, cudaStream_t stream);
/// Gradients of layer norm; weight may be null; grad_weight and grad_bias
/// [d] are overwritten (column sums over the rows, in row order).
void launch_layer_norm_backward(element type, const void* grad, const void* input, const void* mean,
                                const void* rstd, const void* weight, std::int64_t rows, std::int64_t d,
                                void* grad_input, void* grad_weight, void* grad_bias, cudaStream_t stream);

// -- indexing (cuda_index.cu) ----------------------------------------------------------
//
// Index values were validated on the host before a launch.

/// out[i] = source[i with i[dim] = index at i], over out's index space:
/// gather (index strided like out) and index_select (index strides zero but
/// at dim). `source.strides[dim]` is ignored; `dim_stride` is the source's.
void launch_indexed_read(const index_space& shape, const operand& out, const operand& source,
                         const std::int64_t* index, const std::int64_t* index_strides, int dim,
                         std::int64_t dim_stride, cudaStream_t stream);
/// For every position p of `shape` (the iteration space with dim's size
/// `length`), in order of p[dim]: target[p with p[dim] = index at p] +=
/// source[p]. One thread owns all p that differ only in dim, so repeated
/// indices add up in order, without atomics (scatter_add, index_add_).
/// `shape` holds the space with dim collapsed to 1.
void launch_indexed_accumulate(const index_space& shape, std::int64_t length, const operand& target,
                               const operand& source, const std::int64_t* index,
                               const std::int64_t* index_strides, int dim, std::int64_t target_dim_stride,
                               cudaStream_t stream);
/// Bags of weight rows; contiguous operands (see backend.hpp).
void launch_embedding_bag(element type, const void* weight, const std::int64_t* indices, std::int64_t n,
                          const std::int64_t* offsets, std::int64_t bags, std::int64_t d, bool mean, void* out,
                          cudaStream_t stream);
/// Accumulates bag gradients into zeroed grad_weight [num, d], in bag order.
void launch_embedding_bag_backward(element type, const void* grad, const std::int64_t* indices, std::int64_t n,
                                   const std::int64_t* offsets, std::int64_t bags, std::int64_t d, bool mean,
                                   void* grad_weight, cudaStream_t stream);

// -- convolution and pooling (cuda_conv.cu) ------------------------------------------------

/// The geometry of backend.hpp's conv_geometry, without troupe headers.
struct conv_shape {
  std::int64_t channels, height, width, kernel_h, kernel_w, stride, padding, out_h, out_w;
};

/// cols [c*kh*kw, oh*ow] from one image [c, h, w] with element strides s.
void launch_im2col(element type, const void* image, const std::int64_t* image_strides, const conv_shape& g,
                   void* cols, cudaStream_t stream);
/// image [c, h, w] (contiguous) += the adjoint of im2col applied to cols.
void launch_col2im(element type, const void* cols, const conv_shape& g, void* image, cudaStream_t stream);
/// Max pooling of contiguous [planes, h, w] into [planes, oh, ow].
void launch_max_pool2d(element type, const void* input, std::int64_t planes, std::int64_t h, std::int64_t w,
                       std::int64_t kernel, std::int64_t stride, std::int64_t oh, std::int64_t ow, void* output,
                       std::int64_t* indices, cudaStream_t stream);
/// grad_input [planes, in_plane] += grad at indices, in order within a plane.
void launch_max_pool2d_backward(element type, const void* grad, const std::int64_t* indices, std::int64_t planes,
                                std::int64_t out_plane, std::int64_t in_plane, void* grad_input,
                                cudaStream_t stream);

// -- random (cuda_random.cu) -------------------------------------------------------------

/// Mirrors troupe::random_distribution.
enum class distribution : std::uint8_t { uniform, normal, integer, dropout };

/// Fills contiguous `out` (n elements) from Philox (seed, offset + i), the
/// same numbers as the CPU (cpu_random.cpp).
void launch_fill_random(distribution what, element type, std::uint64_t seed, std::uint64_t offset, double a,
                        double b, void* out, std::int64_t n, cudaStream_t stream);

// -- optimizer steps (cuda_optim.cu) -------------------------------------------------------
//
// Contiguous float32 or float64 operands of n elements; the scalars mirror
// troupe::adam_step_args and sgd_step_args (backend.hpp).

struct adam_scalars {
  double beta1, beta2, eps, step_size, bias_correction2_sqrt, l2, decay;
};
struct sgd_scalars {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, first;
};

/// One Adam step of param, m and v in place (double per element).
void launch_adam_step(element type, void* param, const void* grad, void* m, void* v, std::int64_t n,
                      const adam_scalars& s, cudaStream_t stream);
/// One SGD step of param and, when non-null, the momentum buffer.
void launch_sgd_step(element type, void* param, const void* grad, void* buffer, std::int64_t n,
                     const sgd_scalars& s, cudaStream_t stream);

// -- batched GEMM has no kernel of ours: cuBLAS (cuda_backend.cpp) -------------------------

} // namespace troupe::detail::cuda
