#pragma once
// The GPT with its layers split over a tensor-parallel group (issue 20),
// module for module and name for name the one of nn::gpt, so that a split
// model built from a config and seed holds, piece by piece, exactly what
// nn::gpt built from them holds (pieces_equal checks it) and trains to the
// same losses:
//
//   parallel_self_attention  this rank's heads (tensor_parallel_split of
//                            n_head): its q, k and v rows of c_attn
//                            (column-parallel), its columns of c_proj
//                            (row-parallel). A head count the degree does
//                            not divide works; every rank needs a head.
//   parallel_transformer_block  ln_1, attn, ln_2, mlp as nn::transformer_block,
//                            the layer norms whole on every rank, the MLP
//                            column → GELU → row: two allreduces forward,
//                            two backward.
//   parallel_gpt             a sequential as nn::gpt: the embedding stage
//                            (wte vocabulary-parallel, wpe whole), the
//                            blocks, the head stage (ln_f, lm_head
//                            column-parallel without gather). Its output is
//                            this rank's classes of the logits: train it with
//                            vocab_parallel_cross_entropy.
//
// Sequence parallelism (`.sequence_parallel = true`): between the blocks'
// tensor-parallel regions each rank holds only its piece of the sequence
// (tensor_parallel_split of it, so any length works), the layer norms and
// dropouts run on pieces, and the allreduces become an all-gather before
// the column-parallel layers and a reduce-scatter after the row-parallel
// ones: the same bytes, activations a degree smaller. The layer norms'
// parameters stay whole; their gradients are summed over the group. The
// same losses and parameters with it on or off (tested).
//
// Dropout draws the same masks on every rank of a group only with equal
// generators; the equality with one process holds with dropout 0.
#include <cstdint>
#include <memory>

#include "troupe/autograd/nn/causal_self_attention.hpp"
#include "troupe/autograd/nn/gpt.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/parallel/tensor_parallel.hpp"

namespace troupe::parallel {

struct tensor_parallel_options {
  bool sequence_parallel = false;
};

/// nn::layer_norm on this rank's piece of the sequence: its parameters'
/// gradients summed over the group (every rank then holds the whole
/// sequence's, and the replicas of the parameters stay equal).
class sequence_parallel_layer_norm : public nn::layer_norm {
public:
  sequence_parallel_layer_norm(const nn::layer_norm_options& options, reducer_group& group);
  autograd::variable forward(const autograd::variable& input) override;

private:
  reducer_group group_;
};

class parallel_self_attention : public nn::module {
public:
  parallel_self_attention(const nn::attention_options& options, reducer_group& group,
                          tensor_parallel_options parallel = {});
  /// [batch, seq, n_embd] (the same on every rank) → the same, every rank;
  /// with sequence parallelism this rank's piece of seq in and out.
  autograd::variable forward(const autograd::variable& input) override;
  shard_range heads() const noexcept { return heads_; }

private:
  nn::attention_options options_;
  tensor_parallel_options parallel_;
  reducer_group group_;
  shard_range heads_;
  std::shared_ptr<column_parallel_linear> c_attn_;
  std::shared_ptr<row_parallel_linear> c_proj_;
  std::shared_ptr<nn::module> attn_dropout_, resid_dropout_;
};

class parallel_transformer_block : public nn::module {
public:
  parallel_transformer_block(const nn::attention_options& options, reducer_group& group,
                             tensor_parallel_options parallel = {});
  autograd::variable forward(const autograd::variable& input) override;

private:
  std::shared_ptr<nn::module> ln_1_, attn_, ln_2_, mlp_;
};

class parallel_gpt : public nn::sequential {
public:
  parallel_gpt(const nn::gpt_config& config, reducer_group& group, tensor_parallel_options parallel = {});
  const nn::gpt_config& config() const noexcept { return config_; }

private:
  nn::gpt_config config_;
};

} // namespace troupe::parallel
