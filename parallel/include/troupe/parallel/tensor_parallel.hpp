#pragma once
// Tensor-parallel layers (issue 20): one layer's weight split over the
// members of a reducer group, as Megatron-LM does.
//
//   column_parallel_linear  weight rows (output features) split: input
//                           replicated, output this rank's features (or
//                           gathered, gather_output).
//   row_parallel_linear     weight columns (input features) split: input
//                           this rank's features, output summed over the
//                           group (replicated), bias added once.
//   parallel_mlp            column → GELU → row: one allreduce forward and
//                           one backward per MLP.
//
// Equal to one process. Each layer registers the parameters of the layer
// it splits under the same names ("weight", "bias") and initialises them
// by the same rule from the same FQN-keyed draws (module.hpp), keeping its
// piece: a model built with these layers from a seed holds, over its ranks,
// exactly the values the one-process model built from that seed holds, and
// trains to the same losses and parameters (within float summation order).
// tests/parallel/tensor_parallel_test.cpp checks it at degrees 1, 2 and 3
// with sizes the degree does not divide.
//
// Sizes. Features split by tensor_parallel_split: with out_features (or
// in_features) not divisible by the degree the first ranks hold one more.
//
// Sharded state. shards() says which piece of the whole parameter a rank
// holds (global shape, dimension, offset): what a checkpoint saves and
// reshards.
//
// The layers keep a handle on the group (the group object may go first).
// Collectives run on the calling thread (tensor_parallel_collectives.hpp):
// every rank calls forward and backward in the same order.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/module.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/parallel/tensor_parallel_collectives.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/named_tensors.hpp"

namespace troupe::parallel {

/// A piece of a whole parameter that this rank holds: the whole
/// parameter's [offset, offset + size) along `dim`, lying at
/// [local_offset, local_offset + size) of the local parameter along the
/// same dimension (a parameter may hold several pieces: attention's q, k
/// and v rows of its heads).
struct parameter_shard {
  std::string name;    ///< the parameter's local name ("weight")
  dims global_shape;   ///< the whole parameter's shape
  std::int64_t dim = 0; ///< the dimension it is split along; -1: replicated (whole)
  std::int64_t offset = 0;
  std::int64_t size = 0;
  std::int64_t local_offset = 0;
};

/// A module that holds pieces of whole parameters (the others hold their
/// parameters whole): which pieces, by local parameter name.
class sharded_module {
public:
  virtual ~sharded_module() = default;
  virtual std::vector<parameter_shard> shards() const = 0;
};

/// Every parameter of `model` by FQN with the piece this rank holds
/// (`dim` -1 and the whole extent for parameters held whole): what a
/// checkpoint saves, and what the equivalence check below compares.
std::vector<std::pair<std::string, parameter_shard>> parameter_shards(nn::module& model);

/// Whether every parameter of `model` (this rank's pieces) equals the same
/// pieces of `whole` (a one-process model's state, by FQN) within
/// |a - b| <= tolerance (1 + |b|); the error names the first parameter and
/// piece that differs and by how much. The tests' and users' check that a
/// split model holds what the one-process model holds.
expected<void> pieces_equal(nn::module& model, const named_tensors& whole, double tolerance);

/// What column- and row-parallel layers share: nn::linear(`whole`)'s
/// parameters with the weight split along `split_dim` (0: output features,
/// 1: input features), the bias split with the output features or whole.
class sharded_linear : public nn::module, public sharded_module {
public:
  const autograd::variable& weight() const noexcept { return weight_; }
  /// Undefined when built without bias.
  const autograd::variable& bias() const noexcept { return bias_; }
  /// The ranges of the whole weight along the split dimension held here,
  /// in the order they lie in the local weight.
  const std::vector<shard_range>& pieces() const noexcept { return pieces_; }
  std::vector<parameter_shard> shards() const override;

protected:
  /// `pieces` empty: this rank's tensor_parallel_split of the dimension.
  sharded_linear(const nn::linear_options& whole, reducer_group& group, std::int64_t split_dim,
                 std::vector<shard_range> pieces, const char* layer);
  void init_parameter(const std::string& name, tensor& data, generator& gen) override;

  nn::linear_options whole_;
  reducer_group group_;
  std::int64_t split_dim_;
  std::vector<shard_range> pieces_;
  autograd::variable weight_, bias_;
};

struct column_parallel_options {
  /// Gather every rank's output features (the seed's "split one layer
  /// across machines with an all-gather"); false: this rank's features.
  bool gather_output = false;
  /// Output features held here, in order (attention's q, k and v rows of
  /// its heads); empty: tensor_parallel_split. Not with gather_output.
  std::vector<shard_range> pieces{};
  /// Sequence parallelism: the input is this rank's piece along this
  /// dimension and is gathered first (all_gather_from_group, whose
  /// backward reduce-scatters), instead of being the same on every rank.
  std::optional<std::int64_t> sequence_dim{};
};

class column_parallel_linear : public sharded_linear {
public:
  /// This rank's output features of nn::linear(`whole`).
  column_parallel_linear(const nn::linear_options& whole, reducer_group& group, column_parallel_options options = {});

  /// [..., in] (the same on every rank) → [..., out / degree], or [..., out] gathered.
  autograd::variable forward(const autograd::variable& input) override;

private:
  column_parallel_options options_;
};

struct row_parallel_options {
  /// The input already holds this rank's features (a column-parallel
  /// layer's output); false: the whole input, split here.
  bool input_is_parallel = true;
  /// Input features held here (attention: its heads' columns); empty:
  /// tensor_parallel_split. With input_is_parallel false they must be
  /// tensor_parallel_split's.
  std::vector<shard_range> pieces{};
  /// Sequence parallelism: the output is reduce-scattered along this
  /// dimension (each rank gets its piece of the sum) instead of all-reduced.
  std::optional<std::int64_t> sequence_dim{};
};

class row_parallel_linear : public sharded_linear {
public:
  /// This rank's input features of nn::linear(`whole`); the bias whole.
  row_parallel_linear(const nn::linear_options& whole, reducer_group& group, row_parallel_options options = {});

  /// [..., in / degree] (or [..., in]) → [..., out], the same on every rank.
  autograd::variable forward(const autograd::variable& input) override;

private:
  row_parallel_options options_;
};

struct parallel_mlp_options {
  std::int64_t width = 0;
  std::int64_t hidden = 0; ///< 0: 4 * width
  dtype type = dtype::float32;
  std::uint64_t seed = 0;
};

/// Linear(width, hidden) → GELU → Linear(hidden, width) with the hidden
/// features split; children "fc" and "proj" as nn layers would be named.
class parallel_mlp : public nn::module {
public:
  parallel_mlp(const parallel_mlp_options& options, reducer_group& group);
  autograd::variable forward(const autograd::variable& input) override;

  column_parallel_linear& fc() { return *fc_; }
  row_parallel_linear& proj() { return *proj_; }

private:
  std::shared_ptr<column_parallel_linear> fc_;
  std::shared_ptr<row_parallel_linear> proj_;
};

} // namespace troupe::parallel
