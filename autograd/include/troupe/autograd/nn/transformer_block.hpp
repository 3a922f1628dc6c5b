#pragma once
// A pre-LayerNorm transformer block (GPT-2).
#include <memory>

#include "troupe/autograd/nn/causal_self_attention.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
#include "troupe/autograd/nn/sequential.hpp"

namespace troupe::nn {

/// x + attn(ln_1(x)), then x + mlp(ln_2(x)) with mlp = sequential(Linear(d,
/// 4d), GELU, Linear(4d, d), Dropout). Children: `ln_1`, `attn`, `ln_2`,
/// `mlp` (keys such as `attn.c_attn.weight`, `mlp.0.weight`).
class transformer_block : public module {
public:
  explicit transformer_block(const attention_options& options);

  variable forward(const variable& input) override;

private:
  std::shared_ptr<layer_norm> ln_1_;
  std::shared_ptr<causal_self_attention> attn_;
  std::shared_ptr<layer_norm> ln_2_;
  std::shared_ptr<sequential> mlp_;
};

} // namespace troupe::nn
