#pragma once
// Multi-head self-attention with a causal mask (GPT-2 style).
#include <cstdint>
#include <memory>

#include "troupe/autograd/nn/dropout.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

struct attention_options {
  std::int64_t n_embd = 0;
  std::int64_t n_head = 1; ///< must divide n_embd
  double dropout = 0.0;    ///< on the attention weights and the output
  dtype type = dtype::float32;
  std::uint64_t seed = 0;
};

/// Causal attention of `qkv` [batch, seq, 3 * heads * head_size] (q, k and
/// v side by side, each with its heads side by side), scaled by
/// 1/sqrt(head_size), `weights_dropout` on the attention weights →
/// [batch, seq, heads * head_size]. causal_self_attention runs it on all
/// heads, the tensor-parallel attention on a rank's heads.
variable causal_attention(const variable& qkv, std::int64_t heads, std::int64_t head_size, module& weights_dropout);

/// Input [batch, seq, n_embd] → [batch, seq, n_embd]. Children: `c_attn`
/// (Linear n_embd → 3 n_embd, producing q, k, v), `c_proj` (Linear n_embd →
/// n_embd), `attn_dropout`, `resid_dropout`. Position t attends only to
/// positions <= t.
class causal_self_attention : public module {
public:
  explicit causal_self_attention(const attention_options& options);

  variable forward(const variable& input) override;

  const attention_options& options() const noexcept { return options_; }

private:
  attention_options options_;
  std::shared_ptr<linear> c_attn_;
  std::shared_ptr<linear> c_proj_;
  std::shared_ptr<nn::dropout> attn_dropout_;
  std::shared_ptr<nn::dropout> resid_dropout_;
};

} // namespace troupe::nn
