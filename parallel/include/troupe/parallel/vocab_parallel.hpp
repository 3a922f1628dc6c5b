#pragma once
// The vocabulary split over a tensor-parallel group (issue 20), as
// Megatron-LM does, so that no rank ever holds the whole table or the
// whole [tokens, vocabulary] logits:
//
//   vocab_parallel_embedding      rows [offset, offset + size) of the table
//                                 (tensor_parallel_split of the vocabulary),
//                                 each rank looks up the ids it holds, zeros
//                                 elsewhere, and the group sums: one
//                                 allreduce forward, none backward.
//   vocab_parallel_cross_entropy  the mean cross entropy of logits whose
//                                 classes are split the same way (a
//                                 column_parallel_linear's output without
//                                 gather): the rows' maximum and their sums
//                                 of exponentials are combined over the
//                                 group, the target's logit comes from the
//                                 rank that holds it; three collectives of
//                                 [tokens] values, never the logits.
//
// A vocabulary the degree does not divide works (the first ranks hold one
// more row; Megatron-LM pads it instead, and users hit divergence when the
// padding was wrong). Every rank must hold at least one row. Equal to one
// process: the embedding draws the whole table's initial values as
// nn::embedding does (normal(0, init_std), keyed by its FQN) and keeps its
// rows. tests/parallel/tensor_parallel_test.cpp compares an embedding,
// a head and this loss at degrees 2 and 3 with a vocabulary of 11.
#include <cstdint>
#include <string>

#include "troupe/autograd/nn/embedding.hpp"
#include "troupe/autograd/nn/module.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/parallel/tensor_parallel.hpp"

namespace troupe::parallel {

class vocab_parallel_embedding : public nn::module, public sharded_module {
public:
  /// This rank's rows of nn::embedding(`whole`).
  vocab_parallel_embedding(const nn::embedding_options& whole, reducer_group& group);

  /// int64 ids of any shape (every rank the same ids) → ids.shape() + [dim],
  /// the same on every rank. An id outside the vocabulary is a usage_error
  /// naming it (on every rank, before any collective).
  autograd::variable forward(const autograd::variable& ids) override;

  const autograd::variable& weight() const noexcept { return weight_; }
  shard_range rows() const noexcept { return rows_; }
  std::vector<parameter_shard> shards() const override;

protected:
  void init_parameter(const std::string& name, tensor& data, generator& gen) override;

private:
  nn::embedding_options whole_;
  reducer_group group_;
  shard_range rows_;
  autograd::variable weight_;
};

/// Mean cross entropy over [n] int64 `targets` in [0, vocabulary) of
/// `logits` [n, this rank's classes] split by tensor_parallel_split(vocabulary).
autograd::variable vocab_parallel_cross_entropy(const autograd::variable& logits, const tensor& targets,
                                                reducer_group& group, std::int64_t vocabulary);

} // namespace troupe::parallel
