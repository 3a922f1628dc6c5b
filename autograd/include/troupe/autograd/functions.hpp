#pragma once
// Differentiable operations on variables. Each mirrors the tensor op of the
// same name (tensor/ops.hpp) and records a graph node when an input requires
// a gradient and grad mode is on. Each is checked against float64 finite
// differences in tests/autograd.
#include <cstdint>
#include <vector>

#include "troupe/autograd/variable.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::autograd {

// -- elementwise (broadcasting; gradients are summed back to each shape) -----------

variable add(const variable& a, const variable& b);
variable sub(const variable& a, const variable& b);
variable mul(const variable& a, const variable& b);
variable div(const variable& a, const variable& b);
variable add(const variable& a, double b);
variable mul(const variable& a, double b);
variable neg(const variable& a);

inline variable operator+(const variable& a, const variable& b) { return add(a, b); }
inline variable operator-(const variable& a, const variable& b) { return sub(a, b); }
inline variable operator*(const variable& a, const variable& b) { return mul(a, b); }
inline variable operator/(const variable& a, const variable& b) { return div(a, b); }
inline variable operator-(const variable& a) { return neg(a); }
inline variable operator+(const variable& a, double b) { return add(a, b); }
inline variable operator*(const variable& a, double b) { return mul(a, b); }
inline variable operator*(double a, const variable& b) { return mul(b, a); }

variable exp(const variable& a);
variable log(const variable& a);
variable tanh(const variable& a);
variable sqrt(const variable& a);
variable pow(const variable& a, double exponent);
variable relu(const variable& a);
/// Exact GELU, or its tanh approximation (PyTorch's approximate='tanh').
variable gelu(const variable& a, gelu_approximation approximate = gelu_approximation::none);
variable sigmoid(const variable& a);

// -- reductions ------------------------------------------------------------------

variable sum(const variable& a, const dims& dims_to_reduce = {}, bool keepdim = false);
variable mean(const variable& a, const dims& dims_to_reduce = {}, bool keepdim = false);
/// Values of the maximum along dim (gradient flows to the arg-max element).
variable max(const variable& a, std::int64_t dim, bool keepdim = false);
variable softmax(const variable& a, std::int64_t dim);
variable log_softmax(const variable& a, std::int64_t dim);
/// Softmax of `scale * scores` over the last dimension with the causal mask
/// of attention (troupe::causal_softmax): scores [..., queries, keys].
variable causal_softmax(const variable& scores, double scale);
/// The core of causal self-attention as one op (troupe::causal_attention):
/// qkv [batch, seq, 3 width] → [batch, seq, width], `heads` heads.
variable causal_attention(const variable& qkv, std::int64_t heads, double scale);
/// The same with dropout on the weights: `dropout_mask` [batch * heads,
/// seq, seq] as troupe::dropout_mask draws it (nn::causal_self_attention
/// draws it as dropout on the weights would, so the two forms agree).
variable causal_attention(const variable& qkv, std::int64_t heads, double scale, const tensor& dropout_mask);

// -- shape (views; gradients flow back through them) -----------------------------------

variable reshape(const variable& a, const dims& shape);
variable transpose(const variable& a, std::int64_t dim0, std::int64_t dim1);
variable permute(const variable& a, const dims& order);
variable narrow(const variable& a, std::int64_t dim, std::int64_t start, std::int64_t length);
variable expand(const variable& a, const dims& shape);
variable unsqueeze(const variable& a, std::int64_t dim);
variable squeeze(const variable& a, std::int64_t dim);
variable cat(const std::vector<variable>& parts, std::int64_t dim);
variable stack(const std::vector<variable>& parts, std::int64_t dim);
std::vector<variable> split(const variable& a, std::int64_t size, std::int64_t dim);
std::vector<variable> chunk(const variable& a, std::int64_t chunks, std::int64_t dim);

// -- linear algebra --------------------------------------------------------------------

variable matmul(const variable& a, const variable& b);
variable bmm(const variable& a, const variable& b);
/// x [.., in] times weight [out, in] transposed, plus bias [out] (may be
/// undefined): the Linear layer, fused so no transposed copy is made.
variable linear(const variable& x, const variable& weight, const variable& bias);

// -- indexing ----------------------------------------------------------------------------

/// Gradient flows to `a` only (index is an int64 tensor, not differentiable).
variable index_select(const variable& a, std::int64_t dim, const tensor& index);
variable gather(const variable& a, std::int64_t dim, const tensor& index);
variable scatter_add(const variable& a, std::int64_t dim, const tensor& index, const variable& src);
/// Rows of `weight` for each index, shaped index.shape() + [d].
variable embedding(const variable& weight, const tensor& indices);
variable embedding_bag(const variable& weight, const tensor& indices, const tensor& offsets,
                       bag_mode mode);

// -- convolution, pooling, normalisation, dropout ----------------------------------------------

variable conv2d(const variable& input, const variable& weight, const variable& bias,
                conv2d_options options = {});
variable max_pool2d(const variable& input, pool2d_options options = {});
variable layer_norm(const variable& input, const variable& weight, const variable& bias,
                    double eps = 1e-5);
/// Inverted dropout with the default generator (identity when !training or
/// p == 0).
variable dropout(const variable& input, double p, bool training);

// -- losses --------------------------------------------------------------------------------

/// Mean cross entropy of logits [n, classes] against int64 class indices [n].
variable cross_entropy(const variable& logits, const tensor& targets);
/// Mean squared error.
variable mse_loss(const variable& input, const variable& target);

} // namespace troupe::autograd
