#include "troupe/autograd/nn/causal_self_attention.hpp"

#include <cmath>

#include "troupe/autograd/functions.hpp"

namespace troupe::nn {

causal_self_attention::causal_self_attention(const attention_options& options) : options_(options) {
  require(options.n_embd > 0 && options.n_head > 0 && options.n_embd % options.n_head == 0,
          "causal_self_attention: n_head {} must divide n_embd {}", options.n_head, options.n_embd);
  c_attn_ = register_module("c_attn", make<linear>(linear_options{.in_features = options.n_embd,
                                                                   .out_features = 3 * options.n_embd,
                                                                   .type = options.type,
                                                                   .seed = options.seed}));
  c_proj_ = register_module("c_proj", make<linear>(linear_options{.in_features = options.n_embd,
                                                                   .out_features = options.n_embd,
                                                                   .type = options.type,
                                                                   .seed = options.seed}));
  attn_dropout_ = register_module("attn_dropout", make<nn::dropout>(options.dropout));
  resid_dropout_ = register_module("resid_dropout", make<nn::dropout>(options.dropout));
  reset_parameters(options.seed);
}

variable causal_self_attention::forward(const variable& x) {
  require(x.data().rank() == 3 && x.size(2) == options_.n_embd,
          "causal_self_attention: input must be [batch, seq, {}], got {}", options_.n_embd, x.shape());
  const auto batch = x.size(0), seq = x.size(1), embd = options_.n_embd;
  const auto heads = options_.n_head, head_size = embd / heads;

  // q, k, v as [batch * heads, seq, head_size].
  auto qkv = autograd::split((*c_attn_)(x), embd, 2);
  auto to_heads = [&](const variable& t) {
    auto split_heads = autograd::reshape(t, {batch, seq, heads, head_size});
    return autograd::reshape(autograd::permute(split_heads, {0, 2, 1, 3}), {batch * heads, seq, head_size});
  };
  auto q = to_heads(qkv[0]), k = to_heads(qkv[1]), v = to_heads(qkv[2]);

  // Scaled, masked softmax in one op: future positions get weight 0.
  auto scores = autograd::bmm(q, autograd::transpose(k, 1, 2));
  auto weights = (*attn_dropout_)(autograd::causal_softmax(scores, 1.0 / std::sqrt(static_cast<double>(head_size))));
  auto y = autograd::bmm(weights, v); // [batch * heads, seq, head_size]

  // Back to [batch, seq, embd], heads side by side.
  y = autograd::permute(autograd::reshape(y, {batch, heads, seq, head_size}), {0, 2, 1, 3});
  y = autograd::reshape(y, {batch, seq, embd});
  return (*resid_dropout_)((*c_proj_)(y));
}

} // namespace troupe::nn
