#pragma once
// A small GPT: token + position embedding, N transformer blocks, final
// LayerNorm and LM head — built as a sequential so pipelines can cut it.
#include <cstdint>
#include <memory>

#include "troupe/autograd/nn/embedding.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/nn/transformer_block.hpp"

namespace troupe::nn {

struct gpt_config {
  std::int64_t vocab_size = 0;
  std::int64_t block_size = 0; ///< longest sequence (position table size)
  std::int64_t n_layer = 1;
  std::int64_t n_head = 1;
  std::int64_t n_embd = 0;
  double dropout = 0.0;
  dtype type = dtype::float32;
  std::uint64_t seed = 0;
};

/// Token ids [batch, seq] int64 (wrapped: `variable(ids)`) → embeddings
/// [batch, seq, n_embd]: wte(ids) + wpe(0..seq-1), then dropout. Children
/// `wte`, `wpe` (normal(0, 1) as nn::embedding), `drop`.
class gpt_embedding : public module {
public:
  explicit gpt_embedding(const gpt_config& config);
  variable forward(const variable& ids) override;

private:
  gpt_config config_;
  std::shared_ptr<embedding> wte_;
  std::shared_ptr<embedding> wpe_;
  std::shared_ptr<nn::dropout> drop_;
};

/// [batch, seq, n_embd] → logits [batch, seq, vocab]: `ln_f` then `lm_head`
/// (Linear without bias).
class gpt_head : public module {
public:
  explicit gpt_head(const gpt_config& config);
  variable forward(const variable& x) override;

private:
  std::shared_ptr<layer_norm> ln_f_;
  std::shared_ptr<linear> lm_head_;
};

/// The model is itself a sequential of n_layer + 2 stages:
///   0: gpt_embedding, 1..n_layer: transformer_block, n_layer + 1: gpt_head
/// so `slice(begin, end)` yields pipeline stages whose state_dict keys
/// (`0.wte.weight`, `3.attn.c_attn.weight`, `5.lm_head.weight`) are those
/// of the whole model. forward: int64 ids [batch, seq] (seq <= block_size)
/// → logits [batch, seq, vocab].
class gpt : public sequential {
public:
  explicit gpt(const gpt_config& config);

  const gpt_config& config() const noexcept { return config_; }
  /// The whole model as a plain sequential sharing the same modules.
  std::shared_ptr<sequential> as_sequential() const { return slice(0, size()); }

private:
  gpt_config config_;
};

} // namespace troupe::nn
