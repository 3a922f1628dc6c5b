#include "troupe/tensor/backend.hpp"

#include <array>
#include <limits>

#include "cpu_backend.hpp"
#ifdef TROUPE_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {

backend::~backend() = default;

void backend::bmm(const tensor& a, const tensor& b, tensor& out) {
  for (std::int64_t i = 0; i < out.size(0); ++i) {
    auto slice = out.select(0, i);
    gemm(a.select(0, i), b.select(0, i), slice, 1.0, 0.0);
  }
}

void backend::conv2d(const tensor& input, const tensor& weight, const conv_geometry& g, tensor& out) {
  const auto outputs = weight.size(0);
  const auto plane = g.out_h * g.out_w;
  auto w2 = weight.view({outputs, g.channels * g.kernel_h * g.kernel_w});
  auto cols = tensor::empty({w2.size(1), plane}, input.type(), input.where());
  for (std::int64_t i = 0; i < input.size(0); ++i) {
    im2col(input.select(0, i), g, cols);
    auto out_i = out.select(0, i).view({outputs, plane});
    gemm(w2, cols, out_i, 1.0, 0.0);
  }
}

void backend::conv2d_backward(const tensor& grad, const tensor& input, const tensor& weight, const conv_geometry& g,
                              tensor& grad_input, tensor& grad_weight) {
  const auto outputs = weight.size(0);
  const auto plane = g.out_h * g.out_w;
  const auto patch = g.channels * g.kernel_h * g.kernel_w;
  auto w2 = weight.view({outputs, patch});
  auto grad_w2 = grad_weight.view({outputs, patch});
  grad_weight.fill(0.0);
  const bool input_grad = grad_input.defined();
  if (input_grad)
    grad_input.fill(0.0);
  auto cols = tensor::empty({patch, plane}, input.type(), input.where());
  auto grad_cols = input_grad ? tensor::empty({patch, plane}, input.type(), input.where()) : tensor();
  for (std::int64_t i = 0; i < input.size(0); ++i) {
    auto grad_i = grad.select(0, i).view({outputs, plane});
    // dW += dY_i x cols_i^T (the transposed view goes to GEMM as Trans).
    im2col(input.select(0, i), g, cols);
    gemm(grad_i, cols.t(), grad_w2, 1.0, 1.0);
    if (!input_grad)
      continue;
    // dX_i = col2im(W^T x dY_i).
    gemm(w2.t(), grad_i, grad_cols, 1.0, 0.0);
    auto grad_input_i = grad_input.select(0, i);
    col2im(grad_cols, g, grad_input_i);
  }
}

namespace {

/// [queries, cols] of a's dtype on a's device: 1 where row i keeps column
/// j (j <= i), 0 where the causal mask drops it.
tensor causal_keep(const tensor& a, std::int64_t queries) {
  const auto cols = a.size(1);
  auto keep = tensor::zeros({queries, cols}, dtype::float64);
  auto* values = keep.data<double>();
  for (std::int64_t row = 0; row < queries; ++row)
    for (std::int64_t col = 0; col <= row && col < cols; ++col)
      values[row * cols + col] = 1.0;
  return keep.to(a.type()).to(a.where());
}

} // namespace

// `where`, not adding a -inf mask, so what lies under the mask is never
// read (a caller may leave it unwritten).
void backend::causal_softmax(const tensor& a, std::int64_t queries, double scale, tensor& out) {
  const auto cols = a.size(1);
  auto minus_infinity = tensor::full({}, -std::numeric_limits<double>::infinity(), a.type(), a.where());
  auto masked = troupe::where(causal_keep(a, queries), troupe::mul(a.view({-1, queries, cols}), scale), minus_infinity);
  out.copy_from(troupe::softmax(masked, -1).view({-1, cols}));
}

void backend::causal_softmax_backward(const tensor& grad, const tensor& output, std::int64_t queries, double scale,
                                      tensor& out) {
  const auto cols = grad.size(1);
  auto zero = tensor::zeros({}, grad.type(), grad.where());
  auto kept = troupe::where(causal_keep(grad, queries), grad.view({-1, queries, cols}), zero);
  auto dx = troupe::mul(troupe::softmax_backward(kept, output.view({-1, queries, cols}), -1), scale);
  out.copy_from(dx.view({-1, cols}));
}

namespace {

/// Part `part` (0 q, 1 k, 2 v) of qkv [batch, seq, 3 width] as [batch *
/// heads, seq, head size], contiguous.
tensor heads_of(const tensor& qkv, std::int64_t part, std::int64_t heads) {
  const auto batch = qkv.size(0), seq = qkv.size(1), width = qkv.size(2) / 3;
  return qkv.narrow(2, part * width, width)
      .reshape({batch, seq, heads, width / heads})
      .permute({0, 2, 1, 3})
      .contiguous()
      .view({batch * heads, seq, width / heads});
}

/// [batch * heads, seq, head size] back to [batch, seq, width] (heads side by side).
tensor side_by_side(const tensor& per_head, std::int64_t batch) {
  const auto heads = per_head.size(0) / batch, seq = per_head.size(1), head_size = per_head.size(2);
  return per_head.view({batch, heads, seq, head_size}).permute({0, 2, 1, 3}).reshape({batch, seq, heads * head_size});
}

} // namespace

void backend::causal_attention(const tensor& qkv, std::int64_t heads, double scale, const tensor& dropout_mask,
                               tensor& output, tensor& weights) {
  auto q = heads_of(qkv, 0, heads), k = heads_of(qkv, 1, heads), v = heads_of(qkv, 2, heads);
  weights.copy_from(troupe::causal_softmax(troupe::bmm(q, k.transpose(1, 2)), scale));
  const auto kept = dropout_mask.defined() ? troupe::mul(weights, dropout_mask) : weights;
  output.copy_from(side_by_side(troupe::bmm(kept, v), qkv.size(0)));
}

void backend::causal_attention_backward(const tensor& grad, const tensor& qkv, const tensor& weights,
                                        const tensor& dropout_mask, std::int64_t heads, double scale,
                                        tensor& grad_qkv) {
  const auto batch = qkv.size(0), seq = qkv.size(1), width = qkv.size(2) / 3;
  auto q = heads_of(qkv, 0, heads), k = heads_of(qkv, 1, heads), v = heads_of(qkv, 2, heads);
  auto dy = grad.reshape({batch, seq, heads, width / heads}).permute({0, 2, 1, 3}).contiguous().view(
      {batch * heads, seq, width / heads});
  const bool masked = dropout_mask.defined();
  auto dv = troupe::bmm((masked ? troupe::mul(weights, dropout_mask) : weights).transpose(1, 2), dy);
  auto dkept = troupe::bmm(dy, v.transpose(1, 2));
  auto dscores = troupe::causal_softmax_backward(masked ? troupe::mul(dkept, dropout_mask) : dkept, weights, scale);
  auto dq = troupe::bmm(dscores, k);
  auto dk = troupe::bmm(dscores.transpose(1, 2), q);
  grad_qkv.copy_from(troupe::cat({side_by_side(dq, batch), side_by_side(dk, batch), side_by_side(dv, batch)}, 2));
}

void backend::cross_entropy(const tensor& logits, const tensor& targets, tensor& loss, tensor& log_sum_exp) {
  const auto n = logits.size(0);
  const auto at = targets.reshape({n, 1});
  const auto picked = troupe::gather(troupe::log_softmax(logits, 1), 1, at).reshape({n});
  log_sum_exp.copy_from(troupe::sub(troupe::gather(logits, 1, at).reshape({n}), picked));
  loss.copy_from(troupe::mul(troupe::sum(picked), -1.0 / static_cast<double>(n)));
}

void backend::cross_entropy_backward(const tensor& grad, const tensor& logits, const tensor& targets,
                                     const tensor& log_sum_exp, tensor& out) {
  const auto n = logits.size(0);
  const auto at = targets.reshape({n, 1});
  auto probabilities = troupe::exp(troupe::sub(logits, log_sum_exp.reshape({n, 1})));
  const auto minus_one = tensor::full({n, 1}, -1.0, logits.type(), logits.where());
  out.copy_from(troupe::mul(troupe::scatter_add(probabilities, 1, at, minus_one), troupe::mul(grad, 1.0 / static_cast<double>(n))));
}

std::shared_ptr<storage> backend::allocate(std::size_t, device where) {
  throw usage_error(fmt::format("storage::allocate: not implemented by the {} backend (device {})", name(), where));
}

void backend::fill(tensor& out, double) {
  throw usage_error(fmt::format("fill: not implemented by the {} backend (device {})", name(), out.where()));
}

void backend::copy(const tensor& source, tensor& out) {
  throw usage_error(fmt::format("copy_from: not implemented by the {} backend ({} to {})", name(),
                                source.where(), out.where()));
}

tensor backend::transfer(const tensor& source, device target) {
  throw usage_error(fmt::format("to: not implemented by the {} backend ({} to {})", name(), source.where(),
                                target));
}

pending_host_copy backend::start_transfer_to_host(const tensor& source) {
  return {transfer(source, device::cpu()), [] {}};
}

// The optimizer steps as whole-tensor ops, in the parameter's precision
// (the element loops and fused kernels compute Adam in double per element).
void backend::adam_step(tensor& param, const tensor& grad, tensor& m, tensor& v, const adam_step_args& s) {
  const auto g = s.l2 != 0.0 ? add(grad, mul(param, s.l2)) : grad;
  m.copy_from(add(mul(m, s.beta1), mul(g, 1.0 - s.beta1)));
  v.copy_from(add(mul(v, s.beta2), mul(mul(g, g), 1.0 - s.beta2)));
  const auto denominator = add(mul(sqrt(v), 1.0 / s.bias_correction2_sqrt), s.eps);
  param.copy_from(sub(mul(param, s.decay), mul(div(m, denominator), s.step_size)));
}

void backend::sgd_step(tensor& param, const tensor& grad, tensor& buffer, const sgd_step_args& s) {
  const auto d = s.weight_decay != 0.0 ? add(grad, mul(param, s.weight_decay)) : grad;
  if (!buffer.defined()) {
    param.copy_from(sub(param, mul(d, s.lr)));
    return;
  }
  if (s.first)
    buffer.copy_from(d);
  else
    buffer.copy_from(add(mul(buffer, s.momentum), mul(d, 1.0 - s.dampening)));
  param.copy_from(sub(param, mul(s.nesterov ? add(d, mul(buffer, s.momentum)) : buffer, s.lr)));
}

namespace {

// One slot per device_kind. Registration happens at start-up, before ops
// run, so the table needs no lock.
std::array<backend*, 2>& registry() {
  static detail::cpu_backend cpu;
#ifdef TROUPE_HAVE_CUDA
  // Registered here rather than by a static initialiser in the CUDA sources,
  // which the linker would drop from the static library. The backend
  // touches no CUDA API until a cuda:N tensor is made, so a machine without
  // a driver pays nothing.
  static std::array<backend*, 2> table{&cpu, &detail::cuda_backend_instance()};
#else
  static std::array<backend*, 2> table{&cpu, nullptr};
#endif
  return table;
}

} // namespace

backend& backend_for(device where, const char* op) {
  auto slot = static_cast<std::size_t>(where.kind);
  auto& table = registry();
  auto* found = slot < table.size() ? table[slot] : nullptr;
  require(found != nullptr, "{}: no backend for device {} in this build", op, where);
  return *found;
}

void register_backend(device_kind kind, backend* implementation) {
  auto slot = static_cast<std::size_t>(kind);
  TROUPE_ASSERT(slot < registry().size(), "register_backend: unknown device kind {}", slot);
  registry()[slot] = implementation;
}

} // namespace troupe
