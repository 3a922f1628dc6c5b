#pragma once
// The equivalence harness of tensor parallelism (issue 20): run a model
// split over a group beside the same model in one process, layer by layer,
// and say where they first part (every layer's output, every parameter's
// gradient and every layer's input gradient, compared in float64).
//
// Two calls. record_layers runs the one-process model once (any thread)
// and keeps what each layer of it produced; compare_layers runs the split
// model on every rank of the group (each rank on its thread or process,
// the same input everywhere) and compares. "Layers" are the top-level
// layers of a sequential (nn::gpt and parallel_gpt: the embedding, each
// block, the head), named by their index as in the state_dict ("2").
// From tests/parallel/tensor_parallel_equivalence_test.cpp:
//
//   const auto reference = record_layers(whole, ids, {});
//   ...
//   parallel_gpt split(config, *ring.groups[r], {.sequence_parallel = sequence_parallel});
//   split.to(where);
//   reports[r] = compare_layers(reference, split, *ring.groups[r], ids.to(where), {.tolerance = 1e-10});
//
// How it runs. Each layer takes a fresh leaf holding the previous layer's
// output, so its input gradient is observable; backward goes layer by
// layer from the last, seeded with a fixed random gradient of the output
// (the reference's, drawn from `seed`; each rank seeds its piece of it):
// no loss function is needed, and the seed does not depend on the
// outputs, so a wrong backward shows apart from a wrong forward.
//
// Pieces. A split tensor's layout is read from the ranks' shapes (one small
// gather per tensor): shapes equal to the reference's are replicas, each
// compared as it is; shapes that differ from it along one dimension only
// and add up to it there are pieces in rank order along that dimension
// (tensor-parallel features, vocabulary-parallel classes, sequence-parallel
// pieces of the sequence), put together before comparing. Anything else is
// a layout error, reported as a difference of that tensor. Parameter
// gradients are put together from parameter_shards (so a parameter that
// holds several pieces, attention's q, k and v, is put together right).
//
// Order. The first difference is the first in the order the computation
// produces the tensors: the layers' outputs in forward order, then, from
// the last layer back, each layer's parameter gradients and its input
// gradient. A wrong weight in block 2 changes block 2's output first (and
// every gradient of the layers before it later), so block 2 is named, not
// the embedding whose gradient also differs; a wrong backward in a layer
// whose forward is right is named by its input gradient.
//
// Devices. Either model may compute on a GPU (the input on its device):
// what is compared is float64 copies on the host, so a split model on
// `cuda:0` is checked against a reference recorded on the CPU.
//
// Every rank gets the same report (the ranks' differences are gathered and
// the largest kept). Every rank's model must have the same layers and
// parameters, split or whole alike, and the group's collectives run on the
// calling thread as for any tensor-parallel model. Dropout must be off
// (dropout 0 or eval()). The calls leave the models' gradients set.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/tensor/named_tensors.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel {

struct equivalence_options {
  /// A tensor differs when some element has |a - b| > tolerance (1 + |b|),
  /// b the reference's (float64 models agree to about 1e-13 at small
  /// sizes; float32 ones need about 1e-4).
  double tolerance = 1e-9;
  /// Seed of the output gradient backward starts from.
  std::uint64_t seed = 0;
};

/// What one layer of the one-process model produced, in float64.
struct layer_record {
  std::string name;
  tensor output;
  /// Undefined when the input is not a float tensor (token ids).
  tensor input_gradient;
  named_tensors parameter_gradients; ///< by FQN in the whole model
};

/// The one-process run: each layer's record, in forward order.
struct layer_trace {
  std::vector<layer_record> layers;
  tensor output_gradient; ///< the seed of backward
};

/// How far one tensor of the split run lies from the reference's.
struct tensor_difference {
  /// "output", "input gradient", or the parameter's FQN.
  std::string name;
  double max_abs = 0;
  /// The largest |a - b| / (1 + |b|).
  double max_relative = 0;
  /// Why the ranks' pieces do not make up the reference's tensor (a
  /// wrong layout); empty when they do.
  std::string layout_error;
  bool differs = false;
};

struct layer_comparison {
  std::string layer;
  tensor_difference output;
  /// Name empty when the layer's input has no gradient.
  tensor_difference input_gradient;
  std::vector<tensor_difference> parameter_gradients;
};

struct equivalence_report {
  std::vector<layer_comparison> layers; ///< forward order
  /// The first difference in the order the computation produces the
  /// tensors (above); none when every tensor agrees within the tolerance.
  struct first_difference {
    std::string layer;
    tensor_difference what;
  };
  std::optional<first_difference> first;

  bool equal() const noexcept { return !first.has_value(); }
  /// A table: per layer, its output's, input gradient's and worst
  /// parameter gradient's differences, and the first difference.
  std::string to_string() const;
};

/// Runs the one-process `model` on `input` (token ids or activations) and
/// records it. Throws usage_error for an empty model.
layer_trace record_layers(nn::sequential& model, const tensor& input, const equivalence_options& options);

/// On every rank of `group`: runs `model` (this rank's split of the
/// recorded model) on the same `input` and compares it with `reference`.
/// usage_error when the models' layers or parameters differ by name or
/// count; a failed collective throws std::runtime_error naming the member.
equivalence_report compare_layers(const layer_trace& reference, nn::sequential& model, reducer_group& group,
                                  const tensor& input, const equivalence_options& options);

} // namespace troupe::parallel
