// Reductions, softmax and causal softmax. Every reduction is brought to one shape, a
// [rows, cols] view whose rows are reduced (reduced dimensions permuted
// last), so the backend needs a single row kernel.
#include <algorithm>
#include <cmath>

#include "ops_common.hpp"

namespace troupe {

using namespace detail;

namespace {

struct row_layout {
  tensor rows;       // [rows, cols] view (or copy) of the input
  dims result_shape; // the op's output shape
};

/// Permutes `reduce` (normalised, distinct) to the back and flattens.
row_layout to_rows(const tensor& a, const dims& reduce, bool keepdim) {
  dims order;
  dims kept_shape;
  dims result_shape;
  std::int64_t rows = 1;
  std::int64_t cols = 1;
  for (std::int64_t d = 0; d < a.rank(); ++d) {
    const bool reduced = std::find(reduce.begin(), reduce.end(), d) != reduce.end();
    if (!reduced) {
      order.push_back(d);
      rows *= a.shape()[d];
      result_shape.push_back(a.shape()[d]);
    } else if (keepdim) {
      result_shape.push_back(1);
    }
  }
  for (auto d : reduce) {
    order.push_back(d);
    cols *= a.shape()[d];
  }
  return {a.permute(order).reshape({rows, cols}), std::move(result_shape)};
}

dims normalize_dims(const char* op, const dims& requested, const tensor& a) {
  dims out;
  if (requested.empty()) {
    for (std::int64_t d = 0; d < a.rank(); ++d)
      out.push_back(d);
    return out;
  }
  for (auto d : requested) {
    auto n = normalize_dim(d, a.rank(), op);
    require(std::find(out.begin(), out.end(), n) == out.end(),
            "{}: dimension {} repeated in {}", op, d, requested);
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

tensor sum_impl(const char* op, const tensor& a, const dims& dims_to_reduce, bool keepdim) {
  auto reduce = normalize_dims(op, dims_to_reduce, a);
  auto& kernels = backend_for(a.where(), op);
  auto layout = to_rows(a, reduce, keepdim);
  auto values = tensor::empty({layout.rows.size(0)}, a.type(), a.where());
  tensor no_indices;
  kernels.reduce_rows(reduce_op::sum, layout.rows, values, no_indices);
  return values.view(layout.result_shape);
}

tensor softmax_impl(const char* op, const tensor& a, std::int64_t dim, bool log) {
  require_defined(op, a, "input");
  require_floating(op, a);
  auto d = normalize_dim(dim, std::max<std::int64_t>(a.rank(), 1), op);
  auto& kernels = backend_for(a.where(), op);
  if (a.rank() == 0) // a scalar is its own single-element row
    return softmax_impl(op, a.reshape({1}), 0, log).reshape({});
  auto x = a.transpose(d, -1).contiguous();
  auto out = tensor::empty(x.shape(), a.type(), a.where());
  const auto cols = x.size(-1);
  if (x.numel() > 0) {
    auto out_rows = out.view({-1, cols});
    kernels.softmax(x.view({-1, cols}), log, out_rows);
  }
  return out.transpose(d, -1).contiguous();
}

tensor softmax_backward_impl(const char* op, const tensor& grad, const tensor& output,
                             std::int64_t dim, bool log) {
  require_defined(op, grad, "grad");
  require_defined(op, output, "output");
  require_same_device(op, grad, output);
  require_same_dtype(op, grad, output);
  require_floating(op, grad);
  require(grad.shape() == output.shape(), "{}: grad shape {} differs from output shape {}", op,
          grad.shape(), output.shape());
  if (grad.rank() == 0)
    return softmax_backward_impl(op, grad.reshape({1}), output.reshape({1}), 0, log).reshape({});
  auto d = normalize_dim(dim, grad.rank(), op);
  auto& kernels = backend_for(grad.where(), op);
  auto g = grad.transpose(d, -1).contiguous();
  auto y = output.transpose(d, -1).contiguous();
  auto out = tensor::empty(g.shape(), g.type(), g.where());
  const auto cols = g.size(-1);
  if (g.numel() > 0) {
    auto out_rows = out.view({-1, cols});
    kernels.softmax_backward(g.view({-1, cols}), y.view({-1, cols}), log, out_rows);
  }
  return out.transpose(d, -1).contiguous();
}

} // namespace

tensor sum(const tensor& a, const dims& dims_to_reduce, bool keepdim) {
  require_defined("sum", a, "input");
  require_arithmetic("sum", a);
  return sum_impl("sum", a, dims_to_reduce, keepdim);
}

tensor mean(const tensor& a, const dims& dims_to_reduce, bool keepdim) {
  require_defined("mean", a, "input");
  require_floating("mean", a);
  auto total = sum_impl("mean", a, dims_to_reduce, keepdim);
  const auto count = total.numel() == 0 ? 0 : a.numel() / total.numel();
  backend_for(a.where(), "mean").unary(unary_op::mul_scalar, total, 1.0 / static_cast<double>(count),
                                       total);
  return total;
}

max_result max(const tensor& a, std::int64_t dim, bool keepdim) {
  require_defined("max", a, "input");
  require_arithmetic("max", a);
  if (a.rank() == 0) {
    normalize_dim(dim, 1, "max");
    return {a.clone(), tensor::zeros({}, dtype::int64, a.where())};
  }
  auto d = normalize_dim(dim, a.rank(), "max");
  require(a.shape()[d] > 0, "max: dimension {} of {} is empty", d, a.shape());
  auto& kernels = backend_for(a.where(), "max");
  auto layout = to_rows(a, {d}, keepdim);
  auto values = tensor::empty({layout.rows.size(0)}, a.type(), a.where());
  auto indices = tensor::empty({layout.rows.size(0)}, dtype::int64, a.where());
  kernels.reduce_rows(reduce_op::max, layout.rows, values, indices);
  return {values.view(layout.result_shape), indices.view(layout.result_shape)};
}

tensor argmax(const tensor& a, std::int64_t dim, bool keepdim) {
  return max(a, dim, keepdim).indices;
}

tensor max_all(const tensor& a) {
  require_defined("max_all", a, "input");
  require_arithmetic("max_all", a);
  require(a.numel() > 0, "max_all: tensor of shape {} is empty", a.shape());
  auto& kernels = backend_for(a.where(), "max_all");
  auto values = tensor::empty({1}, a.type(), a.where());
  tensor no_indices;
  kernels.reduce_rows(reduce_op::max, a.reshape({1, a.numel()}), values, no_indices);
  return values.view({});
}

tensor softmax(const tensor& a, std::int64_t dim) {
  return softmax_impl("softmax", a, dim, false);
}
tensor log_softmax(const tensor& a, std::int64_t dim) {
  return softmax_impl("log_softmax", a, dim, true);
}
tensor softmax_backward(const tensor& grad, const tensor& output, std::int64_t dim) {
  return softmax_backward_impl("softmax_backward", grad, output, dim, false);
}
tensor log_softmax_backward(const tensor& grad, const tensor& output, std::int64_t dim) {
  return softmax_backward_impl("log_softmax_backward", grad, output, dim, true);
}

tensor causal_softmax(const tensor& scores, double scale) {
  require_defined("causal_softmax", scores, "input");
  require_floating("causal_softmax", scores);
  require(scores.rank() >= 2, "causal_softmax: scores must be [..., queries, keys], got shape {}", scores.shape());
  require(scale > 0.0 && std::isfinite(scale), "causal_softmax: scale must be positive and finite, got {}", scale);
  auto x = scores.contiguous();
  auto out = tensor::empty(x.shape(), x.type(), x.where());
  const auto cols = x.size(-1);
  if (x.numel() > 0) {
    auto out_rows = out.view({-1, cols});
    backend_for(x.where(), "causal_softmax").causal_softmax(x.view({-1, cols}), x.size(-2), scale, out_rows);
  }
  return out;
}

tensor causal_softmax_backward(const tensor& grad, const tensor& output, double scale) {
  const char* op = "causal_softmax_backward";
  require_defined(op, grad, "grad");
  require_defined(op, output, "output");
  require_same_device(op, grad, output);
  require_same_dtype(op, grad, output);
  require_floating(op, grad);
  require(grad.shape() == output.shape(), "{}: grad shape {} differs from output shape {}", op, grad.shape(),
          output.shape());
  require(grad.rank() >= 2, "{}: grad must be [..., queries, keys], got shape {}", op, grad.shape());
  require(scale > 0.0 && std::isfinite(scale), "{}: scale must be positive and finite, got {}", op, scale);
  auto g = grad.contiguous();
  auto y = output.contiguous();
  auto out = tensor::empty(g.shape(), g.type(), g.where());
  const auto cols = g.size(-1);
  if (g.numel() > 0) {
    auto out_rows = out.view({-1, cols});
    backend_for(g.where(), op).causal_softmax_backward(g.view({-1, cols}), y.view({-1, cols}), g.size(-2), scale,
                                                       out_rows);
  }
  return out;
}

namespace {

/// Checks qkv [batch, seq, 3 heads head_size] and the scale; returns the width.
std::int64_t check_attention(const char* op, const tensor& qkv, std::int64_t heads, double scale) {
  require_defined(op, qkv, "qkv");
  require_floating(op, qkv);
  require(qkv.rank() == 3, "{}: qkv must be [batch, seq, 3 width], got shape {}", op, qkv.shape());
  require(heads > 0 && qkv.size(2) % (3 * heads) == 0,
          "{}: qkv's last dimension {} is not 3 x width for {} heads of equal size", op, qkv.size(2), heads);
  require(scale > 0.0 && std::isfinite(scale), "{}: scale must be positive and finite, got {}", op, scale);
  return qkv.size(2) / 3;
}

/// The dropout mask contiguous, after checking it is undefined or lies
/// like the weights [batch * heads, seq, seq].
tensor checked_mask(const char* op, const tensor& qkv, std::int64_t heads, const tensor& dropout_mask) {
  if (!dropout_mask.defined())
    return {};
  require_same_device(op, dropout_mask, qkv);
  require_same_dtype(op, dropout_mask, qkv);
  const auto batch = qkv.size(0), seq = qkv.size(1);
  require(dropout_mask.shape() == dims{batch * heads, seq, seq}, "{}: dropout_mask must be [{}, {}, {}], got shape {}",
          op, batch * heads, seq, seq, dropout_mask.shape());
  return dropout_mask.contiguous();
}

} // namespace

causal_attention_result causal_attention(const tensor& qkv, std::int64_t heads, double scale,
                                         const tensor& dropout_mask) {
  const char* op = "causal_attention";
  const auto width = check_attention(op, qkv, heads, scale);
  const auto mask = checked_mask(op, qkv, heads, dropout_mask);
  auto x = qkv.contiguous();
  const auto batch = x.size(0), seq = x.size(1);
  causal_attention_result result{tensor::empty({batch, seq, width}, x.type(), x.where()),
                                 tensor::empty({batch * heads, seq, seq}, x.type(), x.where())};
  if (x.numel() > 0)
    backend_for(x.where(), op).causal_attention(x, heads, scale, mask, result.output, result.weights);
  return result;
}

tensor causal_attention_backward(const tensor& grad, const tensor& qkv, const tensor& weights, std::int64_t heads,
                                 double scale, const tensor& dropout_mask) {
  const char* op = "causal_attention_backward";
  const auto width = check_attention(op, qkv, heads, scale);
  const auto mask = checked_mask(op, qkv, heads, dropout_mask);
  require_defined(op, grad, "grad");
  require_defined(op, weights, "weights");
  require_same_device(op, grad, qkv);
  require_same_device(op, weights, qkv);
  require_same_dtype(op, grad, qkv);
  require_same_dtype(op, weights, qkv);
  const auto batch = qkv.size(0), seq = qkv.size(1);
  require(grad.shape() == dims{batch, seq, width}, "{}: grad must be [{}, {}, {}], got shape {}", op, batch, seq,
          width, grad.shape());
  require(weights.shape() == dims{batch * heads, seq, seq}, "{}: weights must be [{}, {}, {}], got shape {}", op,
          batch * heads, seq, seq, weights.shape());
  auto x = qkv.contiguous();
  auto out = tensor::empty(x.shape(), x.type(), x.where());
  if (x.numel() > 0)
    backend_for(x.where(), op).causal_attention_backward(grad.contiguous(), x, weights.contiguous(), mask, heads, scale,
                                                         out);
  return out;
}

namespace {

/// Checks logits [n, classes] (n > 0) and targets [n] in [0, classes).
void check_cross_entropy(const char* op, const tensor& logits, const tensor& targets) {
  require_defined(op, logits, "logits");
  require_floating(op, logits);
  require(logits.rank() == 2, "{}: logits must be [n, classes], got shape {}", op, logits.shape());
  require_index(op, targets, "targets");
  require_same_device(op, logits, targets);
  const auto n = logits.size(0);
  require(targets.rank() == 1 && targets.size(0) == n, "{}: targets must be [{}] for logits {}, got shape {}", op, n,
          logits.shape(), targets.shape());
  require(n > 0, "{}: empty batch (logits {})", op, logits.shape());
  const auto classes = logits.size(1);
  auto values = index_values(targets);
  for (std::size_t i = 0; i < values.size(); ++i)
    require(values[i] >= 0 && values[i] < classes, "{}: target {} at position {} is outside [0, {})", op, values[i],
            i, classes);
}

} // namespace

cross_entropy_result cross_entropy(const tensor& logits, const tensor& targets) {
  check_cross_entropy("cross_entropy", logits, targets);
  auto& kernels = backend_for(logits.where(), "cross_entropy");
  cross_entropy_result result{tensor::empty({}, logits.type(), logits.where()),
                              tensor::empty({logits.size(0)}, logits.type(), logits.where())};
  kernels.cross_entropy(logits.contiguous(), targets, result.loss, result.log_sum_exp);
  return result;
}

tensor cross_entropy_backward(const tensor& grad, const tensor& logits, const tensor& targets,
                              const tensor& log_sum_exp) {
  const char* op = "cross_entropy_backward";
  check_cross_entropy(op, logits, targets);
  require_defined(op, grad, "grad");
  require_defined(op, log_sum_exp, "log_sum_exp");
  require(grad.numel() == 1, "{}: grad must hold one element (the loss's), got shape {}", op, grad.shape());
  require(log_sum_exp.shape() == dims{logits.size(0)}, "{}: log_sum_exp shape {} should be [{}] for logits {}", op,
          log_sum_exp.shape(), logits.size(0), logits.shape());
  for (const auto* t : {&grad, &log_sum_exp}) {
    require_same_device(op, logits, *t);
    require_same_dtype(op, logits, *t);
  }
  auto& kernels = backend_for(logits.where(), op);
  auto out = tensor::empty(logits.shape(), logits.type(), logits.where());
  kernels.cross_entropy_backward(grad.reshape({}), logits.contiguous(), targets, log_sum_exp, out);
  return out;
}

} // namespace troupe
