#pragma once
// The kernel table of one device kind (ggml's idea: a backend is a table of
// functions). ops.cpp validates shapes, dtypes and devices, allocates the
// results and then calls `backend_for(x.where()).<kernel>(...)`; kernels
// trust their arguments. A CUDA backend registers itself with
// `register_backend` and every op reaches it without a change to callers.
//
// Conventions shared by every kernel:
// - Operands are on this backend's device and have the dtypes the op
//   checked (float32/float64 unless said otherwise, index tensors int64).
// - Inputs may be arbitrary strided views (including stride-0 broadcasts)
//   unless a kernel says "contiguous". Outputs are written in place.
// - Kernels are single-threaded and deterministic: the same inputs and
//   shapes give bitwise the same result (distributed runs compare against
//   local ones).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/fwd.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe {

/// Elementwise functions of one tensor; the `scalar` argument of
/// `backend::unary` is the parameter of add_scalar, mul_scalar and pow.
enum class unary_op : std::uint8_t {
  neg, abs, add_scalar, mul_scalar, // also int64 and int32
  pow, exp, log, tanh, sqrt, relu, gelu, sigmoid,
  gelu_tanh, ///< GELU's tanh approximation (ops.hpp)
};

/// Elementwise functions of two tensors. The *_backward ops take
/// (grad, saved) where saved is the input (relu, gelu) or the output
/// (sigmoid, tanh) of the forward function.
enum class binary_op : std::uint8_t {
  add, sub, mul, // also int64 and int32
  div, maximum, greater,
  relu_backward, gelu_backward, sigmoid_backward, tanh_backward,
  gelu_tanh_backward,
};

/// Row reductions.
enum class reduce_op : std::uint8_t { sum, max };

/// What `backend::fill_random` draws (see random.hpp for the streams).
enum class random_distribution : std::uint8_t {
  uniform, ///< in [a, b)
  normal,  ///< mean a, standard deviation b (Box-Muller)
  integer, ///< int64 in [a, b)
  dropout, ///< 0 with probability a, else b (the keep scale)
};

/// Geometry of one 2-D convolution image, shared by im2col and col2im.
struct conv_geometry {
  std::int64_t channels = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::int64_t kernel_h = 0;
  std::int64_t kernel_w = 0;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t out_h = 0;
  std::int64_t out_w = 0;
};

/// One Adam or AdamW step (autograd/src/optim/adam.cpp has the formulas):
/// m = beta1 m + (1 - beta1) g', v = beta2 v + (1 - beta2) g'^2 with
/// g' = g + l2 p, then p = decay p - step_size m / (sqrt(v) /
/// bias_correction2_sqrt + eps).
struct adam_step_args {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double step_size = 0;             ///< lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1; ///< sqrt(1 - beta2^t)
  double l2 = 0;                    ///< Adam's weight decay, added to the gradient
  double decay = 1;                 ///< AdamW's factor on the parameter
};

/// One SGD step (autograd/src/optim/sgd.cpp): d = g + weight_decay p; with
/// momentum, b = d on the first step, else momentum b + (1 - dampening) d,
/// and the step is d + momentum b (Nesterov) or b; p -= lr step.
struct sgd_step_args {
  double lr = 0;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool first = false; ///< the momentum buffer is set from d, not updated
};

/// The kernels of one device kind. Every function is documented with what
/// it computes; shapes are those ops.cpp has already checked.
class backend {
public:
  virtual ~backend();

  /// "cpu", "cuda", ... for messages.
  virtual std::string_view name() const = 0;

  // -- memory and copies (devices other than the CPU) -------------------------------
  //
  // The CPU's allocation, fill and copy live in storage.cpp and tensor.cpp;
  // storage::allocate, tensor::fill, tensor::copy_from and tensor::to(device)
  // call these for every other device. The defaults throw usage_error
  // "<op>: not implemented by the <name> backend".

  /// `bytes` of uninitialised memory on `where` (this backend's kind); throws
  /// usage_error naming the device when it is not available.
  virtual std::shared_ptr<storage> allocate(std::size_t bytes, device where);
  /// Sets every element of `out` (any layout) to `value`.
  virtual void fill(tensor& out, double value);
  /// out = source converted to out's dtype; source has out's shape (possibly
  /// broadcast) and lives on out's device.
  virtual void copy(const tensor& source, tensor& out);
  /// A new contiguous tensor on `target` (the CPU, or a device of this kind)
  /// with the shape, dtype and data of contiguous, non-empty `source` on
  /// another device; one of the two is of this backend's kind. The backend
  /// allocates the result, so that it can place it in the order of the
  /// stream that copies into it. The caller may free or change `source`'s
  /// host memory once it returns.
  virtual tensor transfer(const tensor& source, device target);
  /// Starts copying contiguous, non-empty `source` (on this backend's kind)
  /// to a new host tensor (start_copy_to_host). The default copies at once
  /// with transfer and returns a wait that does nothing.
  virtual pending_host_copy start_transfer_to_host(const tensor& source);

  // -- elementwise -----------------------------------------------------------

  /// out = op(a, scalar); a has out's shape (possibly broadcast). `out` may
  /// be `a` itself (in-place ops).
  virtual void unary(unary_op op, const tensor& a, double scalar, tensor& out) = 0;
  /// out = op(a, b); a and b have out's shape (possibly broadcast).
  virtual void binary(binary_op op, const tensor& a, const tensor& b, tensor& out) = 0;
  /// a += alpha * b, b having a's shape (possibly broadcast).
  virtual void axpy(tensor& a, const tensor& b, double alpha) = 0;
  /// out = cond != 0 ? a : b; cond of any dtype, all of out's shape.
  virtual void where(const tensor& cond, const tensor& a, const tensor& b, tensor& out) = 0;

  // -- reductions (over the last dimension of a 2-D [rows, cols] view) ---------

  /// values[r] = op over a[r, :]; for max, `indices` (int64, or undefined)
  /// gets the first position of the maximum. The summation order depends
  /// only on cols, never on the layout.
  virtual void reduce_rows(reduce_op op, const tensor& a, tensor& values, tensor& indices) = 0;
  /// Row-wise (log-)softmax of contiguous [rows, cols] into `out`.
  virtual void softmax(const tensor& a, bool log, tensor& out) = 0;
  /// dL/dx of row-wise (log-)softmax from dL/dy and y, all contiguous.
  virtual void softmax_backward(const tensor& grad, const tensor& output, bool log,
                                tensor& out) = 0;
  /// Causal softmax of contiguous [rows, cols], rows being `queries`-row
  /// matrices stacked: row r gives weight 0 to columns after r % queries and
  /// softmax(scale x) to the others (scale > 0). Elements under the mask are
  /// never read. The default selects -inf there (`where`) and calls softmax.
  virtual void causal_softmax(const tensor& a, std::int64_t queries, double scale, tensor& out);
  /// dL/dx of causal_softmax from dL/dy and its output y, all contiguous:
  /// scale y (g - <g, y>) on the kept elements, 0 under the mask (where g
  /// is never read). The default composes where, softmax_backward and mul.
  virtual void causal_softmax_backward(const tensor& grad, const tensor& output, std::int64_t queries, double scale,
                                       tensor& out);
  /// Causal self-attention of contiguous qkv [batch, seq, 3 width] (q, k
  /// and v side by side, each `heads` heads of width / heads): for every
  /// batch and head, weights = causal_softmax(q k^T, scale) [seq, seq] and
  /// y = weights v, written into `weights` [batch * heads, seq, seq] (0
  /// above the diagonal) and `output` [batch, seq, width] (heads side by
  /// side). With a defined `dropout_mask` (contiguous, the weights' shape,
  /// each element 0 or 1 / (1 - p)) y = (weights * dropout_mask) v, and
  /// `weights` stays the softmax. The default composes permutes, bmm,
  /// causal_softmax and mul.
  virtual void causal_attention(const tensor& qkv, std::int64_t heads, double scale, const tensor& dropout_mask,
                                tensor& output, tensor& weights);
  /// dL/dqkv of causal_attention from dL/dy `grad` [batch, seq, width],
  /// qkv, the forward's weights and its dropout mask (or none), all
  /// contiguous, into `grad_qkv`.
  virtual void causal_attention_backward(const tensor& grad, const tensor& qkv, const tensor& weights,
                                         const tensor& dropout_mask, std::int64_t heads, double scale,
                                         tensor& grad_qkv);
  /// Mean cross entropy of contiguous logits [n, classes] against int64
  /// targets [n] (checked to lie in [0, classes)): `loss` (rank 0) and each
  /// row's log Σ exp in `log_sum_exp` [n]. The default composes
  /// log_softmax, gather and sum.
  virtual void cross_entropy(const tensor& logits, const tensor& targets, tensor& loss,
                             tensor& log_sum_exp);
  /// out = grad (exp(logits - log_sum_exp) - onehot(targets)) / n with the
  /// rank-0 `grad`; logits contiguous. The default composes exp, scatter_add
  /// and mul.
  virtual void cross_entropy_backward(const tensor& grad, const tensor& logits, const tensor& targets,
                                      const tensor& log_sum_exp, tensor& out);

  // -- linear algebra ------------------------------------------------------------

  /// out = alpha * a x b + beta * out for 2-D operands (beta == 0 ignores
  /// out's contents, NaNs included).
  virtual void gemm(const tensor& a, const tensor& b, tensor& out, double alpha,
                    double beta) = 0;
  /// out[i] = a[i] x b[i] for 3-D operands. The default loops gemm.
  virtual void bmm(const tensor& a, const tensor& b, tensor& out);

  // -- indexing (indices already validated) ----------------------------------------

  /// out.select(dim, j) = a.select(dim, index[j]); index 1-D.
  virtual void index_select(const tensor& a, std::int64_t dim, const tensor& index,
                            tensor& out) = 0;
  /// out[i] = a[i with i[dim] = index[i]]; out has index's shape.
  virtual void gather(const tensor& a, std::int64_t dim, const tensor& index, tensor& out) = 0;
  /// out[i with i[dim] = index[i]] += src[i], for i over index's shape, in
  /// row-major order of i.
  virtual void scatter_add_(tensor& out, std::int64_t dim, const tensor& index,
                            const tensor& src) = 0;
  /// a.select(dim, index[j]) += src.select(dim, j), in order of j.
  virtual void index_add_(tensor& a, std::int64_t dim, const tensor& index,
                          const tensor& src) = 0;
  /// Bags of weight rows (see ops.hpp); out [bags, d] is overwritten.
  virtual void embedding_bag(const tensor& weight, const tensor& indices, const tensor& offsets,
                             bool mean, tensor& out) = 0;
  /// Accumulates the bag gradients into zeroed `grad_weight` [num, d].
  virtual void embedding_bag_backward(const tensor& grad, const tensor& indices,
                                      const tensor& offsets, bool mean,
                                      tensor& grad_weight) = 0;

  // -- convolution, pooling, normalisation ---------------------------------------------

  /// cols [c * kh * kw, oh * ow] (contiguous) from one image [c, h, w].
  virtual void im2col(const tensor& image, const conv_geometry& geometry, tensor& cols) = 0;
  /// The adjoint of im2col: adds cols into the contiguous image [c, h, w].
  virtual void col2im(const tensor& cols, const conv_geometry& geometry, tensor& image) = 0;
  /// out [n, o, oh, ow] = the convolution of contiguous input [n, c, h, w]
  /// with contiguous weight [o, c, kh, kw], without bias; out is
  /// overwritten. The default runs im2col and gemm image by image.
  virtual void conv2d(const tensor& input, const tensor& weight, const conv_geometry& geometry, tensor& out);
  /// Overwrites grad_input [n, c, h, w] (unless it is undefined: then only
  /// the weight's is computed) and grad_weight [o, c, kh, kw] with the
  /// gradients of conv2d from contiguous grad [n, o, oh, ow], input and
  /// weight. The default runs im2col, gemm and col2im image by image.
  virtual void conv2d_backward(const tensor& grad, const tensor& input, const tensor& weight,
                               const conv_geometry& geometry, tensor& grad_input, tensor& grad_weight);
  /// Max pooling of contiguous [n, c, h, w]; indices are flat in h * w.
  virtual void max_pool2d(const tensor& input, std::int64_t kernel, std::int64_t stride,
                          tensor& output, tensor& indices) = 0;
  /// Adds grad at indices into zeroed contiguous grad_input [n, c, h, w].
  virtual void max_pool2d_backward(const tensor& grad, const tensor& indices,
                                   tensor& grad_input) = 0;
  /// Layer norm of contiguous [rows, d]; weight/bias [d] may be undefined.
  virtual void layer_norm(const tensor& input, const tensor& weight, const tensor& bias,
                          double eps, tensor& output, tensor& mean, tensor& rstd) = 0;
  /// Gradients of layer_norm (contiguous operands; weight may be undefined).
  virtual void layer_norm_backward(const tensor& grad, const tensor& input, const tensor& mean,
                                   const tensor& rstd, const tensor& weight,
                                   tensor& grad_input, tensor& grad_weight,
                                   tensor& grad_bias) = 0;

  // -- random ------------------------------------------------------------------------

  /// Fills contiguous `out` from the stream `gen` (element i uses Philox
  /// counter gen.offset + i); the caller advances the generator.
  virtual void fill_random(random_distribution what, const generator& gen, double a, double b,
                           tensor& out) = 0;

  // -- optimizer steps -----------------------------------------------------------------
  //
  // One update of a contiguous parameter from its gradient and state (same
  // shape, dtype and device). The optimizers call these on every device
  // (the CPU's are one pass each, tensor/src/cpu_optim.cpp). The defaults compose
  // whole-tensor ops (about fifteen passes over the parameter's memory); a
  // backend overrides them with one fused pass.

  /// Updates `param`, `m` and `v` in place.
  virtual void adam_step(tensor& param, const tensor& grad, tensor& m, tensor& v, const adam_step_args& step);
  /// Updates `param` and, when `momentum_buffer` is defined (momentum > 0),
  /// the buffer, in place.
  virtual void sgd_step(tensor& param, const tensor& grad, tensor& momentum_buffer, const sgd_step_args& step);
};

/// The backend for `where`'s device kind; throws usage_error
/// "<op>: no backend for device cuda:0 in this build" when none is
/// registered. (A registered backend whose device is missing fails where
/// memory is allocated: "storage::allocate: device cuda:0 is not
/// available: <reason>".)
backend& backend_for(device where, const char* op = "backend_for");

/// Installs the backend of a device kind (not owned; it must outlive every
/// op). The CPU backend is always present; a CUDA build registers its own.
void register_backend(device_kind kind, backend* implementation);

} // namespace troupe
