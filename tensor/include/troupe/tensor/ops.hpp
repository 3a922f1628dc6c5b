#pragma once
// The tensor operations. Every op checks shapes, dtypes and devices and
// throws usage_error naming the op and the offending values; kernels come
// from the backend of the operands' device (backend.hpp).
//
// Floating ops support float32 and float64 (bfloat16 is storage-only:
// convert with `to`). Index tensors are int64. Results are new contiguous
// tensors unless the name ends in `_` (in place).
#include <cstdint>
#include <optional>
#include <vector>

#include "troupe/tensor/random.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {

// -- broadcasting ------------------------------------------------------------

/// The broadcast of two shapes (NumPy rules); throws usage_error naming `op`.
dims broadcast_shapes(const dims& a, const dims& b, const char* op = "broadcast");
/// Sums `t` down to `shape` (the reverse of broadcasting; autograd uses it).
tensor sum_to(const tensor& t, const dims& shape);

// -- elementwise arithmetic (broadcasting) ---------------------------------------

tensor add(const tensor& a, const tensor& b);
tensor sub(const tensor& a, const tensor& b);
tensor mul(const tensor& a, const tensor& b);
tensor div(const tensor& a, const tensor& b);
tensor add(const tensor& a, double b);
tensor mul(const tensor& a, double b);
/// a + alpha * b, in place on `a` (b broadcast to a's shape). Optimizers use it.
void add_(tensor& a, const tensor& b, double alpha = 1.0);
void mul_(tensor& a, double factor);
tensor neg(const tensor& a);
tensor maximum(const tensor& a, const tensor& b);
/// 1 where a > b, else 0, in a's dtype.
tensor greater(const tensor& a, const tensor& b);
/// cond != 0 ? a : b (broadcasting).
tensor where(const tensor& cond, const tensor& a, const tensor& b);

inline tensor operator+(const tensor& a, const tensor& b) { return add(a, b); }
inline tensor operator-(const tensor& a, const tensor& b) { return sub(a, b); }
inline tensor operator*(const tensor& a, const tensor& b) { return mul(a, b); }
inline tensor operator/(const tensor& a, const tensor& b) { return div(a, b); }
inline tensor operator-(const tensor& a) { return neg(a); }
inline tensor operator+(const tensor& a, double b) { return add(a, b); }
inline tensor operator*(const tensor& a, double b) { return mul(a, b); }
inline tensor operator*(double a, const tensor& b) { return mul(b, a); }

// -- elementwise math ------------------------------------------------------------

tensor exp(const tensor& a);
tensor log(const tensor& a);
tensor tanh(const tensor& a);
tensor sqrt(const tensor& a);
tensor pow(const tensor& a, double exponent);
tensor abs(const tensor& a);
tensor relu(const tensor& a);
/// How gelu computes Phi (PyTorch's `approximate` argument).
enum class gelu_approximation : std::uint8_t {
  none, ///< exact: x * Phi(x) with the error function (PyTorch's default)
  tanh, ///< 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (approximate='tanh')
};
tensor gelu(const tensor& a, gelu_approximation approximate = gelu_approximation::none);
tensor sigmoid(const tensor& a);

// Fused derivatives, used by autograd (grad is dL/dy).
tensor relu_backward(const tensor& grad, const tensor& input);
tensor gelu_backward(const tensor& grad, const tensor& input,
                     gelu_approximation approximate = gelu_approximation::none);
tensor sigmoid_backward(const tensor& grad, const tensor& output);
tensor tanh_backward(const tensor& grad, const tensor& output);

// -- reductions --------------------------------------------------------------

/// Sum over `dims_to_reduce` (empty: over all dimensions).
tensor sum(const tensor& a, const dims& dims_to_reduce = {}, bool keepdim = false);
tensor mean(const tensor& a, const dims& dims_to_reduce = {}, bool keepdim = false);
struct max_result {
  tensor values;
  tensor indices; // int64
};
max_result max(const tensor& a, std::int64_t dim, bool keepdim = false);
tensor argmax(const tensor& a, std::int64_t dim, bool keepdim = false);
/// Largest element of the whole tensor, as a rank-0 tensor.
tensor max_all(const tensor& a);

tensor softmax(const tensor& a, std::int64_t dim);
tensor log_softmax(const tensor& a, std::int64_t dim);
/// dL/dx given dL/dy and y = softmax(x) (resp. y = log_softmax(x)).
tensor softmax_backward(const tensor& grad, const tensor& output, std::int64_t dim);
tensor log_softmax_backward(const tensor& grad, const tensor& output, std::int64_t dim);
/// Softmax over the last dimension of `scale * scores` with a causal mask:
/// scores is [..., queries, keys] and element (i, j) of each matrix gets
/// weight 0 for j > i (as adding triu(-inf, diagonal 1) before softmax
/// would), without making the mask or the scaled copy. scale > 0. The result
/// is contiguous.
tensor causal_softmax(const tensor& scores, double scale);
/// dL/dscores given dL/dy and y = causal_softmax(scores, scale).
tensor causal_softmax_backward(const tensor& grad, const tensor& output, double scale);

struct causal_attention_result {
  tensor output;  ///< [batch, seq, width]: each head's weights v, heads side by side
  tensor weights; ///< [batch * heads, seq, seq]: causal_softmax(q k^T, scale), for the backward
};
/// The core of causal self-attention as one op, from the fused projection
/// qkv [batch, seq, 3 width] (q, k, v side by side, each of `heads` heads
/// of width / heads): per batch and head, softmax(scale q k^T) with keys
/// after the query masked, times v. The same as splitting qkv into heads,
/// bmm, causal_softmax and bmm, without the heads' copies and without the
/// products under the mask. With a `dropout_mask` (the weights' shape, as
/// dropout_mask() draws it) each head's weights are multiplied by it before
/// v, as dropout on the weights would; `weights` stays the softmax.
causal_attention_result causal_attention(const tensor& qkv, std::int64_t heads, double scale,
                                         const tensor& dropout_mask = {});
/// dL/dqkv given dL/dy `grad` [batch, seq, width], qkv, the forward's
/// weights and its dropout mask (or none).
tensor causal_attention_backward(const tensor& grad, const tensor& qkv, const tensor& weights, std::int64_t heads,
                                 double scale, const tensor& dropout_mask = {});

struct cross_entropy_result {
  tensor loss;        ///< rank 0: mean over rows of log Σ exp(logits) - logits[target]
  tensor log_sum_exp; ///< [n]: each row's log Σ exp(logits), for the backward
};
/// Mean cross entropy of logits [n, classes] against int64 class indices
/// [n] in [0, classes), as one op: what -mean(gather(log_softmax(logits,
/// 1), 1, targets)) gives, without the [n, classes] log-probabilities.
cross_entropy_result cross_entropy(const tensor& logits, const tensor& targets);
/// dL/dlogits = grad (softmax(logits) - onehot(targets)) / n, from the
/// rank-0 dL/dloss `grad` and the forward's log_sum_exp.
tensor cross_entropy_backward(const tensor& grad, const tensor& logits, const tensor& targets,
                              const tensor& log_sum_exp);

// -- linear algebra (OpenBLAS on the CPU) -------------------------------------------

/// [m, k] x [k, n] -> [m, n]. Transposed views are passed to GEMM as
/// transposes, not copied.
tensor matmul(const tensor& a, const tensor& b);
/// Batched: [b, m, k] x [b, k, n] -> [b, m, n].
tensor bmm(const tensor& a, const tensor& b);
/// out = beta * out + alpha * a x b for 2-D operands, in place; lets
/// gradient accumulation skip a temporary.
void addmm_(tensor& out, const tensor& a, const tensor& b, double alpha = 1.0, double beta = 1.0);

// -- indexing ------------------------------------------------------------------

tensor index_select(const tensor& a, std::int64_t dim, const tensor& index);
tensor gather(const tensor& a, std::int64_t dim, const tensor& index);
/// A copy of `a` with `src` added at `index` along `dim` (torch.scatter_add).
tensor scatter_add(const tensor& a, std::int64_t dim, const tensor& index, const tensor& src);
/// In place: a.index_select(dim, index) += src, repeated indices accumulate.
void index_add_(tensor& a, std::int64_t dim, const tensor& index, const tensor& src);

enum class bag_mode : std::uint8_t { sum, mean };
/// weight [num, d]; indices [n] int64; offsets [bags] int64 (bag i is
/// indices[offsets[i] : offsets[i+1]], the last bag runs to n). An empty bag
/// gives zeros. Returns [bags, d].
tensor embedding_bag(const tensor& weight, const tensor& indices, const tensor& offsets,
                     bag_mode mode);
/// Gradient of embedding_bag with respect to weight (dense [num, d]).
tensor embedding_bag_backward(const tensor& grad, const tensor& indices, const tensor& offsets,
                              bag_mode mode, std::int64_t num_embeddings);

// -- convolution and pooling (NCHW) --------------------------------------------------

struct conv2d_options {
  std::int64_t stride = 1;
  std::int64_t padding = 0;
};
/// input [n, c, h, w], weight [o, c, kh, kw], bias [o] or undefined.
tensor conv2d(const tensor& input, const tensor& weight, const tensor& bias,
              conv2d_options options = {});
struct conv2d_grads {
  tensor input, weight, bias;
};
/// The gradients of conv2d from grad [n, o, oh, ow]; the bias's when
/// bias_defined, the input's unless input_grad is false (a network's first
/// layer needs none, and it costs as much as the weight's).
conv2d_grads conv2d_backward(const tensor& grad, const tensor& input, const tensor& weight,
                             bool bias_defined, conv2d_options options = {}, bool input_grad = true);

struct pool2d_options {
  std::int64_t kernel = 2;
  std::int64_t stride = 2;
};
struct max_pool2d_result {
  tensor output;
  tensor indices; // int64, flat index into each input plane (h * w)
};
max_pool2d_result max_pool2d(const tensor& input, pool2d_options options = {});
tensor max_pool2d_backward(const tensor& grad, const tensor& indices, const dims& input_shape);

// -- normalisation and dropout -------------------------------------------------------

struct layer_norm_result {
  tensor output;
  tensor mean; // per normalised row
  tensor rstd; // 1 / sqrt(var + eps)
};
/// Normalises over the last dimension; weight and bias [d] may be undefined.
layer_norm_result layer_norm(const tensor& input, const tensor& weight, const tensor& bias,
                             double eps = 1e-5);
struct layer_norm_grads {
  tensor input, weight, bias;
};
layer_norm_grads layer_norm_backward(const tensor& grad, const tensor& input,
                                     const layer_norm_result& saved, const tensor& weight);

/// Mask of keep/(1-p) scale factors (0 for dropped elements) drawn from
/// `gen`, shaped like `shape`, on `where`; the caller multiplies by it.
tensor dropout_mask(const dims& shape, double p, generator& gen, dtype type = dtype::float32,
                    device where = device::cpu());

// -- joining and splitting --------------------------------------------------------------

tensor cat(const std::vector<tensor>& parts, std::int64_t dim);
tensor stack(const std::vector<tensor>& parts, std::int64_t dim);
/// Views of consecutive pieces of `size` along dim (the last may be smaller).
std::vector<tensor> split(const tensor& a, std::int64_t size, std::int64_t dim);
/// `chunks` views of (nearly) equal size along dim, as torch.chunk.
std::vector<tensor> chunk(const tensor& a, std::int64_t chunks, std::int64_t dim);

// -- creation ---------------------------------------------------------------------

/// [start, end) with step, as int64 when all are integral, else float32.
tensor arange(double start, double end, double step = 1.0, dtype type = dtype::int64);
// Draws on any device give the same numbers for the same generator state
// (Philox: element i depends only on the seed and the offset plus i);
// normal draws agree within float rounding between devices.

/// Uniform in [low, high).
tensor rand(const dims& shape, generator& gen, double low = 0.0, double high = 1.0,
            dtype type = dtype::float32, device where = device::cpu());
/// Standard normal (Box-Muller over Philox).
tensor randn(const dims& shape, generator& gen, double mean = 0.0, double stddev = 1.0,
             dtype type = dtype::float32, device where = device::cpu());
/// Uniform integers in [low, high), int64.
tensor randint(const dims& shape, generator& gen, std::int64_t low, std::int64_t high,
               device where = device::cpu());

// -- comparison -------------------------------------------------------------------------

/// |a - b| <= atol + rtol * |b| elementwise, with equal shapes; NaNs differ.
bool allclose(const tensor& a, const tensor& b, double rtol = 1e-5, double atol = 1e-8);
/// Largest |a - b| (for test messages).
double max_abs_diff(const tensor& a, const tensor& b);

} // namespace troupe
