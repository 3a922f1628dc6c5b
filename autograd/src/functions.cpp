// Differentiable ops: forward with the tensor op, backward with tensor ops
// (the fused *_backward kernels where the tensor module has them).
#include "troupe/autograd/functions.hpp"

#include <functional>
#include <numeric>
#include <string>
#include <utility>

#include "pass.hpp"
#include "troupe/autograd/deferred_weight_grads.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/node.hpp"

namespace troupe::autograd {

namespace {

/// Which inputs of a node need a gradient (its edge is valid); lets a
/// backward skip work, as for the input of a network's first layer.
using needs_mask = std::vector<bool>;

/// A node whose backward is a closure over what forward saved. Releasing the
/// saved state drops the closure, so a second run is an error that names the
/// op instead of a use of freed memory.
class function_node final : public node {
public:
  using backward_fn = std::function<std::vector<tensor>(std::vector<tensor>&, const needs_mask&)>;

  function_node(std::string name, backward_fn fn, needs_mask needs)
      : name_(std::move(name)), fn_(std::move(fn)), needs_(std::move(needs)) {}

  std::vector<tensor> apply(std::vector<tensor> grad_outputs) override {
    require(static_cast<bool>(fn_),
            "backward: {} runs a second time but its saved tensors were freed by the first "
            "backward; pass retain_graph = true to the first backward",
            name_);
    return fn_(grad_outputs, needs_);
  }
  std::string name() const override { return name_; }
  void release_saved() override { fn_ = nullptr; }

private:
  std::string name_;
  backward_fn fn_;
  needs_mask needs_;
};

std::shared_ptr<function_node> make_node(const char* name, function_node::backward_fn fn,
                                         const std::vector<variable>& inputs) {
  std::vector<edge> edges;
  needs_mask needs;
  edges.reserve(inputs.size());
  for (const auto& v : inputs) {
    edges.push_back(gradient_edge(v));
    needs.push_back(edges.back().valid());
  }
  auto fn_node = std::make_shared<function_node>(std::string(name) + "_backward", std::move(fn),
                                                 std::move(needs));
  fn_node->set_next_edges(std::move(edges));
  return fn_node;
}

/// Wraps `out` and, when an input requires a gradient and grad mode is on,
/// records a node whose backward is `backward(grad, needs)` returning one
/// gradient per input.
template <class Backward>
variable record(const char* name, tensor out, const std::vector<variable>& inputs,
                Backward backward) {
  if (!any_requires_grad(inputs))
    return variable(std::move(out));
  auto fn = make_node(
      name,
      [b = std::move(backward)](std::vector<tensor>& grads, const needs_mask& needs) {
        return b(grads[0], needs);
      },
      inputs);
  return variable::make_result(std::move(out), std::move(fn));
}

/// As record, for ops with several outputs; `backward(grads, needs)` gets one
/// (possibly undefined) gradient per output.
template <class Backward>
std::vector<variable> record_multi(const char* name, std::vector<tensor> outs,
                                   const std::vector<variable>& inputs, Backward backward) {
  std::vector<variable> result;
  result.reserve(outs.size());
  if (!any_requires_grad(inputs)) {
    for (auto& t : outs)
      result.emplace_back(std::move(t));
    return result;
  }
  auto fn = make_node(
      name,
      [b = std::move(backward)](std::vector<tensor>& grads, const needs_mask& needs) {
        return b(grads, needs);
      },
      inputs);
  fn->set_num_inputs(static_cast<std::uint32_t>(outs.size()));
  for (std::size_t i = 0; i < outs.size(); ++i)
    result.push_back(variable::make_result(std::move(outs[i]), fn, static_cast<std::uint32_t>(i)));
  return result;
}

const tensor& data_of(const variable& v, const char* op, const char* what) {
  require(v.defined(), "{}: {} is undefined", op, what);
  return v.data();
}

/// The shape of a reduction's result with keepdim (reduced dims set to 1).
dims kept_shape(const dims& shape, const dims& reduced, const char* op) {
  dims keep = shape;
  if (reduced.empty()) {
    std::fill(keep.begin(), keep.end(), 1);
    return keep;
  }
  for (auto d : reduced)
    keep[static_cast<std::size_t>(normalize_dim(d, static_cast<std::int64_t>(shape.size()), op))] = 1;
  return keep;
}

tensor zeros_like(const tensor& t) { return tensor::zeros(t.shape(), t.type(), t.where()); }

} // namespace

// -- elementwise ------------------------------------------------------------------

variable add(const variable& a, const variable& b) {
  const auto& x = data_of(a, "add", "a");
  const auto& y = data_of(b, "add", "b");
  return record("add", troupe::add(x, y), {a, b},
                [sa = x.shape(), sb = y.shape()](const tensor& g, const needs_mask& n) {
                  return std::vector<tensor>{n[0] ? sum_to(g, sa) : tensor(),
                                             n[1] ? sum_to(g, sb) : tensor()};
                });
}

variable sub(const variable& a, const variable& b) {
  const auto& x = data_of(a, "sub", "a");
  const auto& y = data_of(b, "sub", "b");
  return record("sub", troupe::sub(x, y), {a, b},
                [sa = x.shape(), sb = y.shape()](const tensor& g, const needs_mask& n) {
                  return std::vector<tensor>{n[0] ? sum_to(g, sa) : tensor(),
                                             n[1] ? troupe::neg(sum_to(g, sb)) : tensor()};
                });
}

variable mul(const variable& a, const variable& b) {
  const auto& x = data_of(a, "mul", "a");
  const auto& y = data_of(b, "mul", "b");
  // Each side's gradient needs only the other side's value.
  tensor keep_x = b.requires_grad() ? x : tensor();
  tensor keep_y = a.requires_grad() ? y : tensor();
  return record("mul", troupe::mul(x, y), {a, b},
                [x = keep_x, y = keep_y, sa = x.shape(), sb = y.shape()](const tensor& g,
                                                                         const needs_mask& n) {
                  return std::vector<tensor>{n[0] ? sum_to(troupe::mul(g, y), sa) : tensor(),
                                             n[1] ? sum_to(troupe::mul(g, x), sb) : tensor()};
                });
}

variable div(const variable& a, const variable& b) {
  const auto& x = data_of(a, "div", "a");
  const auto& y = data_of(b, "div", "b");
  return record("div", troupe::div(x, y), {a, b}, [x, y](const tensor& g, const needs_mask& n) {
    tensor ga, gb;
    if (n[0])
      ga = sum_to(troupe::div(g, y), x.shape());
    if (n[1]) // d(x/y)/dy = -x / y^2
      gb = sum_to(troupe::neg(troupe::div(troupe::mul(g, x), troupe::mul(y, y))), y.shape());
    return std::vector<tensor>{ga, gb};
  });
}

variable add(const variable& a, double b) {
  return record("add_scalar", troupe::add(data_of(a, "add", "a"), b), {a},
                [](const tensor& g, const needs_mask&) { return std::vector<tensor>{g}; });
}

variable mul(const variable& a, double b) {
  return record("mul_scalar", troupe::mul(data_of(a, "mul", "a"), b), {a},
                [b](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{troupe::mul(g, b)};
                });
}

variable neg(const variable& a) {
  return record("neg", troupe::neg(data_of(a, "neg", "a")), {a},
                [](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{troupe::neg(g)};
                });
}

variable exp(const variable& a) {
  auto out = troupe::exp(data_of(a, "exp", "a"));
  return record("exp", out, {a}, [out](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{troupe::mul(g, out)};
  });
}

variable log(const variable& a) {
  const auto& x = data_of(a, "log", "a");
  return record("log", troupe::log(x), {a}, [x](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{troupe::div(g, x)};
  });
}

variable tanh(const variable& a) {
  auto out = troupe::tanh(data_of(a, "tanh", "a"));
  return record("tanh", out, {a}, [out](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{tanh_backward(g, out)};
  });
}

variable sqrt(const variable& a) {
  auto out = troupe::sqrt(data_of(a, "sqrt", "a"));
  return record("sqrt", out, {a}, [out](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{troupe::div(g, troupe::mul(out, 2.0))};
  });
}

variable pow(const variable& a, double exponent) {
  const auto& x = data_of(a, "pow", "a");
  return record("pow", troupe::pow(x, exponent), {a},
                [x, exponent](const tensor& g, const needs_mask&) {
                  auto d = troupe::mul(troupe::pow(x, exponent - 1.0), exponent);
                  return std::vector<tensor>{troupe::mul(g, d)};
                });
}

variable relu(const variable& a) {
  const auto& x = data_of(a, "relu", "a");
  return record("relu", troupe::relu(x), {a}, [x](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{relu_backward(g, x)};
  });
}

variable gelu(const variable& a, gelu_approximation approximate) {
  const auto& x = data_of(a, "gelu", "a");
  return record("gelu", troupe::gelu(x, approximate), {a}, [x, approximate](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{gelu_backward(g, x, approximate)};
  });
}

variable sigmoid(const variable& a) {
  auto out = troupe::sigmoid(data_of(a, "sigmoid", "a"));
  return record("sigmoid", out, {a}, [out](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{sigmoid_backward(g, out)};
  });
}

// -- reductions ----------------------------------------------------------------------

variable sum(const variable& a, const dims& dims_to_reduce, bool keepdim) {
  const auto& x = data_of(a, "sum", "a");
  auto keep = kept_shape(x.shape(), dims_to_reduce, "sum");
  return record("sum", troupe::sum(x, dims_to_reduce, keepdim), {a},
                [keep, shape = x.shape()](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{g.reshape(keep).expand(shape).contiguous()};
                });
}

variable mean(const variable& a, const dims& dims_to_reduce, bool keepdim) {
  const auto& x = data_of(a, "mean", "a");
  auto keep = kept_shape(x.shape(), dims_to_reduce, "mean");
  auto kept = numel_of(keep);
  double count = kept == 0 ? 0.0 : static_cast<double>(x.numel()) / static_cast<double>(kept);
  return record("mean", troupe::mean(x, dims_to_reduce, keepdim), {a},
                [keep, count, shape = x.shape()](const tensor& g, const needs_mask&) {
                  auto spread = g.reshape(keep).expand(shape);
                  return std::vector<tensor>{troupe::mul(spread, 1.0 / count)};
                });
}

variable max(const variable& a, std::int64_t dim, bool keepdim) {
  const auto& x = data_of(a, "max", "a");
  auto d = normalize_dim(dim, x.rank(), "max");
  auto r = troupe::max(x, d, keepdim);
  auto index = keepdim ? r.indices : r.indices.unsqueeze(d);
  return record("max", r.values, {a},
                [index, d, keepdim, x](const tensor& g, const needs_mask&) {
                  auto gk = keepdim ? g : g.unsqueeze(d);
                  return std::vector<tensor>{troupe::scatter_add(zeros_like(x), d, index, gk)};
                });
}

variable softmax(const variable& a, std::int64_t dim) {
  auto out = troupe::softmax(data_of(a, "softmax", "a"), dim);
  return record("softmax", out, {a}, [out, dim](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{softmax_backward(g, out, dim)};
  });
}

variable causal_attention(const variable& qkv, std::int64_t heads, double scale) {
  return causal_attention(qkv, heads, scale, tensor());
}

variable causal_attention(const variable& qkv, std::int64_t heads, double scale, const tensor& dropout_mask) {
  auto x = data_of(qkv, "causal_attention", "qkv");
  auto result = troupe::causal_attention(x, heads, scale, dropout_mask);
  return record("causal_attention", result.output, {qkv},
                [x, weights = result.weights, dropout_mask, heads, scale](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{causal_attention_backward(g, x, weights, heads, scale, dropout_mask)};
                });
}

variable causal_softmax(const variable& scores, double scale) {
  auto out = troupe::causal_softmax(data_of(scores, "causal_softmax", "scores"), scale);
  return record("causal_softmax", out, {scores}, [out, scale](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{causal_softmax_backward(g, out, scale)};
  });
}

variable log_softmax(const variable& a, std::int64_t dim) {
  auto out = troupe::log_softmax(data_of(a, "log_softmax", "a"), dim);
  return record("log_softmax", out, {a}, [out, dim](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{log_softmax_backward(g, out, dim)};
  });
}

// -- shape -------------------------------------------------------------------------------

variable reshape(const variable& a, const dims& shape) {
  const auto& x = data_of(a, "reshape", "a");
  return record("reshape", x.reshape(shape), {a},
                [in = x.shape()](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{g.reshape(in)};
                });
}

variable transpose(const variable& a, std::int64_t dim0, std::int64_t dim1) {
  const auto& x = data_of(a, "transpose", "a");
  return record("transpose", x.transpose(dim0, dim1), {a},
                [dim0, dim1](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{g.transpose(dim0, dim1)};
                });
}

variable permute(const variable& a, const dims& order) {
  const auto& x = data_of(a, "permute", "a");
  auto out = x.permute(order); // validates the order
  dims inverse(order.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    inverse[static_cast<std::size_t>(normalize_dim(order[i], x.rank(), "permute"))] =
        static_cast<std::int64_t>(i);
  return record("permute", out, {a}, [inverse](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{g.permute(inverse)};
  });
}

variable narrow(const variable& a, std::int64_t dim, std::int64_t start, std::int64_t length) {
  const auto& x = data_of(a, "narrow", "a");
  auto out = x.narrow(dim, start, length);
  return record("narrow", out, {a}, [x, dim, start, length](const tensor& g, const needs_mask&) {
    auto full = zeros_like(x);
    full.narrow(dim, start, length).copy_from(g);
    return std::vector<tensor>{full};
  });
}

variable expand(const variable& a, const dims& shape) {
  const auto& x = data_of(a, "expand", "a");
  return record("expand", x.expand(shape), {a}, [in = x.shape()](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{sum_to(g, in)};
  });
}

variable unsqueeze(const variable& a, std::int64_t dim) {
  const auto& x = data_of(a, "unsqueeze", "a");
  return record("unsqueeze", x.unsqueeze(dim), {a},
                [in = x.shape()](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{g.reshape(in)};
                });
}

variable squeeze(const variable& a, std::int64_t dim) {
  const auto& x = data_of(a, "squeeze", "a");
  return record("squeeze", x.squeeze(dim), {a}, [in = x.shape()](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{g.reshape(in)};
  });
}

variable cat(const std::vector<variable>& parts, std::int64_t dim) {
  require(!parts.empty(), "cat: no tensors to join");
  std::vector<tensor> datas;
  for (const auto& p : parts)
    datas.push_back(data_of(p, "cat", "a part"));
  auto out = troupe::cat(datas, dim);
  auto d = normalize_dim(dim, out.rank(), "cat");
  dims sizes;
  for (const auto& t : datas)
    sizes.push_back(t.size(d));
  return record("cat", out, parts, [sizes, d](const tensor& g, const needs_mask& n) {
    std::vector<tensor> grads(sizes.size());
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (n[i])
        grads[i] = g.narrow(d, offset, sizes[i]);
      offset += sizes[i];
    }
    return grads;
  });
}

variable stack(const std::vector<variable>& parts, std::int64_t dim) {
  require(!parts.empty(), "stack: no tensors to join");
  std::vector<tensor> datas;
  for (const auto& p : parts)
    datas.push_back(data_of(p, "stack", "a part"));
  auto out = troupe::stack(datas, dim);
  auto d = normalize_dim(dim, out.rank(), "stack");
  return record("stack", out, parts, [d](const tensor& g, const needs_mask& n) {
    std::vector<tensor> grads(n.size());
    for (std::size_t i = 0; i < n.size(); ++i)
      if (n[i])
        grads[i] = g.select(d, static_cast<std::int64_t>(i));
    return grads;
  });
}

namespace {

/// split and chunk: the pieces are views; a piece's gradient lands in its
/// slice of a zero gradient for the whole.
std::vector<variable> record_pieces(const char* name, const variable& a, std::int64_t dim,
                                    std::vector<tensor> pieces) {
  const auto& x = a.data();
  auto d = normalize_dim(dim, x.rank(), name);
  dims sizes;
  for (const auto& p : pieces)
    sizes.push_back(p.size(d));
  return record_multi(name, std::move(pieces), {a},
                      [x, d, sizes](std::vector<tensor>& grads, const needs_mask&) {
                        auto full = zeros_like(x);
                        std::int64_t offset = 0;
                        for (std::size_t i = 0; i < sizes.size(); ++i) {
                          if (grads[i].defined())
                            full.narrow(d, offset, sizes[i]).copy_from(grads[i]);
                          offset += sizes[i];
                        }
                        return std::vector<tensor>{full};
                      });
}

} // namespace

std::vector<variable> split(const variable& a, std::int64_t size, std::int64_t dim) {
  return record_pieces("split", a, dim, troupe::split(data_of(a, "split", "a"), size, dim));
}

std::vector<variable> chunk(const variable& a, std::int64_t chunks, std::int64_t dim) {
  return record_pieces("chunk", a, dim, troupe::chunk(data_of(a, "chunk", "a"), chunks, dim));
}

// -- linear algebra ---------------------------------------------------------------------------

variable matmul(const variable& a, const variable& b) {
  const auto& x = data_of(a, "matmul", "a");
  const auto& y = data_of(b, "matmul", "b");
  tensor keep_x = b.requires_grad() ? x : tensor();
  tensor keep_y = a.requires_grad() ? y : tensor();
  return record("matmul", troupe::matmul(x, y), {a, b},
                [x = keep_x, y = keep_y](const tensor& g, const needs_mask& n) {
                  // Transposed views go to GEMM as transposes, not copies.
                  return std::vector<tensor>{n[0] ? troupe::matmul(g, y.t()) : tensor(),
                                             n[1] ? troupe::matmul(x.t(), g) : tensor()};
                });
}

variable bmm(const variable& a, const variable& b) {
  const auto& x = data_of(a, "bmm", "a");
  const auto& y = data_of(b, "bmm", "b");
  tensor keep_x = b.requires_grad() ? x : tensor();
  tensor keep_y = a.requires_grad() ? y : tensor();
  return record("bmm", troupe::bmm(x, y), {a, b},
                [x = keep_x, y = keep_y](const tensor& g, const needs_mask& n) {
                  return std::vector<tensor>{n[0] ? troupe::bmm(g, y.transpose(1, 2)) : tensor(),
                                             n[1] ? troupe::bmm(x.transpose(1, 2), g) : tensor()};
                });
}

variable linear(const variable& x, const variable& weight, const variable& bias) {
  const auto& in = data_of(x, "linear", "input");
  const auto& w = data_of(weight, "linear", "weight");
  require(w.rank() == 2, "linear: weight must be [out, in], got shape {}", w.shape());
  require(in.rank() >= 1, "linear: input must have at least one dimension, got a scalar");
  const auto in_features = w.size(1);
  const auto out_features = w.size(0);
  require(in.size(-1) == in_features, "linear: input {} has {} features but weight {} expects {}",
          in.shape(), in.size(-1), w.shape(), in_features);
  if (bias.defined())
    require(bias.data().rank() == 1 && bias.data().size(0) == out_features,
            "linear: bias must be [{}], got shape {}", out_features, bias.shape());

  // Leading dimensions flatten into rows: [rows, in] x [in, out].
  auto x2 = in.reshape({-1, in_features});
  tensor y2;
  if (bias.defined()) {
    y2 = tensor::empty({x2.size(0), out_features}, in.type(), in.where());
    y2.copy_from(bias.data());
    addmm_(y2, x2, w.t(), 1.0, 1.0);
  } else {
    y2 = troupe::matmul(x2, w.t());
  }
  dims out_shape = in.shape();
  out_shape.back() = out_features;

  tensor keep_x = weight.requires_grad() ? x2 : tensor();
  tensor keep_w = x.requires_grad() ? w : tensor();
  // A leaf weight's dW may be deferred (deferred_weight_grads.hpp).
  std::shared_ptr<node> weight_accumulator =
      grad_enabled() && weight.requires_grad() && weight.is_leaf() ? grad_accumulator(weight) : nullptr;
  return record("linear", y2.reshape(out_shape), {x, weight, bias},
                [x2 = keep_x, w = keep_w, in_shape = in.shape(), out_features, weight_accumulator](
                    const tensor& g, const needs_mask& n) {
                  auto g2 = g.reshape({-1, out_features});
                  std::vector<tensor> grads(3);
                  if (n[0]) // dx = dy W
                    grads[0] = troupe::matmul(g2, w).reshape(in_shape);
                  auto* deferral = deferral_scope::active();
                  if (n[1] && deferral != nullptr && weight_accumulator && pass_scope::accumulating())
                    deferral->defer(weight_accumulator, g2, x2); // dW later, over all micro-batches
                  else if (n[1]) // dW = dy^T x
                    grads[1] = troupe::matmul(g2.t(), x2);
                  if (n[2]) // db = rows of dy summed
                    grads[2] = troupe::sum(g2, {0});
                  return grads;
                });
}

// -- indexing ---------------------------------------------------------------------------------

variable index_select(const variable& a, std::int64_t dim, const tensor& index) {
  const auto& x = data_of(a, "index_select", "a");
  auto out = troupe::index_select(x, dim, index);
  auto d = normalize_dim(dim, x.rank(), "index_select");
  return record("index_select", out, {a}, [x, d, index](const tensor& g, const needs_mask&) {
    auto grad = zeros_like(x);
    index_add_(grad, d, index, g);
    return std::vector<tensor>{grad};
  });
}

variable gather(const variable& a, std::int64_t dim, const tensor& index) {
  const auto& x = data_of(a, "gather", "a");
  auto out = troupe::gather(x, dim, index);
  auto d = normalize_dim(dim, x.rank(), "gather");
  return record("gather", out, {a}, [x, d, index](const tensor& g, const needs_mask&) {
    return std::vector<tensor>{troupe::scatter_add(zeros_like(x), d, index, g)};
  });
}

variable scatter_add(const variable& a, std::int64_t dim, const tensor& index,
                     const variable& src) {
  const auto& x = data_of(a, "scatter_add", "a");
  const auto& s = data_of(src, "scatter_add", "src");
  auto out = troupe::scatter_add(x, dim, index, s);
  auto d = normalize_dim(dim, x.rank(), "scatter_add");
  return record("scatter_add", out, {a, src}, [d, index](const tensor& g, const needs_mask& n) {
    return std::vector<tensor>{n[0] ? g : tensor(),
                               n[1] ? troupe::gather(g, d, index) : tensor()};
  });
}

variable embedding(const variable& weight, const tensor& indices) {
  const auto& w = data_of(weight, "embedding", "weight");
  require(w.rank() == 2, "embedding: weight must be [num, dim], got shape {}", w.shape());
  require(indices.defined() && indices.type() == dtype::int64,
          "embedding: indices must be int64, got {}", indices);
  auto flat = indices.reshape({-1});
  dims out_shape = indices.shape();
  out_shape.push_back(w.size(1));
  auto out = troupe::index_select(w, 0, flat).reshape(out_shape);
  return record("embedding", out, {weight},
                [flat, shape = w.shape(), type = w.type(), where = w.where()](
                    const tensor& g, const needs_mask&) {
                  auto grad = tensor::zeros(shape, type, where);
                  index_add_(grad, 0, flat, g.reshape({-1, shape[1]}));
                  return std::vector<tensor>{grad};
                });
}

variable embedding_bag(const variable& weight, const tensor& indices, const tensor& offsets,
                       bag_mode mode) {
  const auto& w = data_of(weight, "embedding_bag", "weight");
  auto out = troupe::embedding_bag(w, indices, offsets, mode);
  return record("embedding_bag", out, {weight},
                [indices, offsets, mode, num = w.size(0)](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{embedding_bag_backward(g, indices, offsets, mode, num)};
                });
}

// -- convolution, pooling, normalisation, dropout ----------------------------------------------------

variable conv2d(const variable& input, const variable& weight, const variable& bias,
                conv2d_options options) {
  const auto& x = data_of(input, "conv2d", "input");
  const auto& w = data_of(weight, "conv2d", "weight");
  auto out = troupe::conv2d(x, w, bias.defined() ? bias.data() : tensor(), options);
  return record("conv2d", out, {input, weight, bias},
                [x, w, has_bias = bias.defined(), options](const tensor& g, const needs_mask& n) {
                  auto r = conv2d_backward(g, x, w, has_bias && n[2], options, n[0]);
                  return std::vector<tensor>{n[0] ? r.input : tensor(), n[1] ? r.weight : tensor(),
                                             n[2] ? r.bias : tensor()};
                });
}

variable max_pool2d(const variable& input, pool2d_options options) {
  const auto& x = data_of(input, "max_pool2d", "input");
  auto r = troupe::max_pool2d(x, options);
  return record("max_pool2d", r.output, {input},
                [indices = r.indices, shape = x.shape()](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{max_pool2d_backward(g, indices, shape)};
                });
}

variable layer_norm(const variable& input, const variable& weight, const variable& bias,
                    double eps) {
  const auto& x = data_of(input, "layer_norm", "input");
  tensor w = weight.defined() ? weight.data() : tensor();
  auto r = troupe::layer_norm(x, w, bias.defined() ? bias.data() : tensor(), eps);
  auto out = r.output;
  return record("layer_norm", out, {input, weight, bias},
                [x, w, saved = std::move(r)](const tensor& g, const needs_mask& n) {
                  auto grads = layer_norm_backward(g, x, saved, w);
                  return std::vector<tensor>{n[0] ? grads.input : tensor(),
                                             n[1] ? grads.weight : tensor(),
                                             n[2] ? grads.bias : tensor()};
                });
}

variable dropout(const variable& input, double p, bool training) {
  const auto& x = data_of(input, "dropout", "input");
  require(p >= 0.0 && p <= 1.0, "dropout: probability {} is outside [0, 1]", p);
  if (!training || p == 0.0)
    return input;
  auto mask = p == 1.0 ? zeros_like(x) : dropout_mask(x.shape(), p, default_generator(), x.type(), x.where());
  return record("dropout", troupe::mul(x, mask), {input},
                [mask](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{troupe::mul(g, mask)};
                });
}

// -- losses ----------------------------------------------------------------------------------------

variable cross_entropy(const variable& logits, const tensor& targets) {
  const auto& x = data_of(logits, "cross_entropy", "logits");
  auto r = troupe::cross_entropy(x, targets);
  return record("cross_entropy", r.loss, {logits},
                [x, targets, lse = r.log_sum_exp](const tensor& g, const needs_mask&) {
                  return std::vector<tensor>{cross_entropy_backward(g, x, targets, lse)};
                });
}

variable mse_loss(const variable& input, const variable& target) {
  const auto& x = data_of(input, "mse_loss", "input");
  const auto& y = data_of(target, "mse_loss", "target");
  require(x.shape() == y.shape(), "mse_loss: input shape {} differs from target shape {}",
          x.shape(), y.shape());
  auto diff = sub(input, target);
  return mean(mul(diff, diff));
}

} // namespace troupe::autograd
