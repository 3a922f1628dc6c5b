#include "troupe/autograd/nn/causal_self_attention.hpp"

#include <cmath>

#include "troupe/autograd/functions.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

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

variable causal_attention(const variable& qkv, std::int64_t heads, std::int64_t head_size, module& weights_dropout) {
  const auto width = heads * head_size;
  require(qkv.data().rank() == 3 && qkv.size(2) == 3 * width,
          "causal_attention: qkv must be [batch, seq, {}] for {} heads of {}, got {}", 3 * width, heads, head_size,
          qkv.shape());
  const auto scale = 1.0 / std::sqrt(static_cast<double>(head_size));
  // The whole core is one op (no copies of the heads, no masked products).
  // Dropout on the weights goes in as a mask drawn as dropout() would draw
  // it for them, so the op equals the composed form below, which only
  // another module on the weights still takes (it needs them as a tensor).
  if (const auto* dropout = dynamic_cast<const nn::dropout*>(&weights_dropout)) {
    if (dropout->p() == 0.0 || !dropout->is_training())
      return autograd::causal_attention(qkv, heads, scale);
    const auto& x = qkv.data();
    const dims shape{qkv.size(0) * heads, qkv.size(1), qkv.size(1)};
    return autograd::causal_attention(qkv, heads, scale,
                                      dropout_mask(shape, dropout->p(), default_generator(), x.type(), x.where()));
  }

  const auto batch = qkv.size(0), seq = qkv.size(1);
  // q, k, v as [batch * heads, seq, head_size].
  auto parts = autograd::split(qkv, width, 2);
  auto to_heads = [&](const variable& t) {
    auto split_heads = autograd::reshape(t, {batch, seq, heads, head_size});
    return autograd::reshape(autograd::permute(split_heads, {0, 2, 1, 3}), {batch * heads, seq, head_size});
  };
  auto q = to_heads(parts[0]), k = to_heads(parts[1]), v = to_heads(parts[2]);

  // Scaled, masked softmax in one op: future positions get weight 0.
  auto scores = autograd::bmm(q, autograd::transpose(k, 1, 2));
  auto weights = weights_dropout(autograd::causal_softmax(scores, scale));
  auto y = autograd::bmm(weights, v); // [batch * heads, seq, head_size]

  // Back to [batch, seq, width], heads side by side.
  y = autograd::permute(autograd::reshape(y, {batch, heads, seq, head_size}), {0, 2, 1, 3});
  return autograd::reshape(y, {batch, seq, width});
}

variable causal_self_attention::forward(const variable& x) {
  require(x.data().rank() == 3 && x.size(2) == options_.n_embd,
          "causal_self_attention: input must be [batch, seq, {}], got {}", options_.n_embd, x.shape());
  const auto heads = options_.n_head, head_size = options_.n_embd / heads;
  return (*resid_dropout_)((*c_proj_)(causal_attention((*c_attn_)(x), heads, head_size, *attn_dropout_)));
}

} // namespace troupe::nn
