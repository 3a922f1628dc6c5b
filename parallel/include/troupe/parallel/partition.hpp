#pragma once
// Splitting a sequential model into contiguous pipeline stages: by hand (a
// balance list or split points) or by profiling every layer and choosing the
// split that minimises the slowest stage within each place's memory cap.
//
// From tests/parallel/partition_test.cpp:
//
//   auto profile = profile_layers(*model, sample, profiling);
//   ...
//   auto split = balance_by_profile(profile, stages_of(2));
//   ASSERT_TRUE(split.has_value());
//   EXPECT_EQ(split->end(0), 2u) << to_string(*split);
//
// profile_layers measures each layer's costs; stages_of(2) is a
// balance_options with two stages. When no split fits the memory caps,
// balance_by_profile returns an error instead. to_string prints a line per
// stage: "stage 0: layers [0, 5), predicted 12.000 ms, 1.0 KiB".
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

/// What one layer costs, measured on a sample micro-batch.
struct layer_profile {
  double forward_ms = 0;
  double backward_ms = 0;
  /// Parameter bytes of the layer.
  std::size_t parameter_bytes = 0;
  /// Bytes of the layer's output for the sample (what a stage stashes per
  /// in-flight micro-batch without recomputation).
  std::size_t activation_bytes = 0;

  double total_ms() const noexcept { return forward_ms + backward_ms; }
};

struct profile_options {
  /// Timed repetitions per layer after one warm-up; the minimum is kept (the
  /// least disturbed run on a shared machine).
  int repetitions = 3;
};

/// Runs every layer of `model` forward and backward on `sample` (the input
/// of layer 0, one micro-batch) and measures it. Parameter gradients are
/// dropped afterwards, so profiling leaves no trace on the model.
std::vector<layer_profile> profile_layers(nn::sequential& model, const tensor& sample,
                                          const profile_options& options = {});

/// Contiguous stages: stage i holds layers [boundaries[i], boundaries[i+1]).
struct partition {
  std::vector<std::size_t> boundaries;
  /// Per stage, from the profile (empty for a manual partition).
  std::vector<double> predicted_ms;
  std::vector<std::size_t> predicted_bytes;

  std::size_t stages() const noexcept { return boundaries.empty() ? 0 : boundaries.size() - 1; }
  std::size_t begin(std::size_t stage) const { return boundaries.at(stage); }
  std::size_t end(std::size_t stage) const { return boundaries.at(stage + 1); }
  std::size_t layers() const noexcept { return boundaries.empty() ? 0 : boundaries.back(); }
  /// The predicted time of the slowest stage (0 without a profile).
  double bottleneck_ms() const;
};

/// torchgpipe's `balance`: the number of layers of each stage, e.g. {4, 4}.
/// Throws usage_error when a count is zero or the counts do not sum to
/// `layers`.
partition from_balance(const std::vector<std::size_t>& balance, std::size_t layers);

/// Split points: the first layer of every stage after the first, e.g. {4}
/// for [0, 4) and [4, 8). Throws usage_error unless strictly increasing
/// and inside (0, layers).
partition from_split_points(const std::vector<std::size_t>& split_points, std::size_t layers);

/// As many stages as places, layer counts differing by at most one.
partition even(std::size_t stages, std::size_t layers);

struct balance_options {
  std::size_t stages = 2;
  /// Memory cap of each stage's place in bytes (0: unlimited). Empty: no
  /// caps; otherwise one entry per stage.
  std::vector<std::size_t> memory_caps{};
  /// Bytes a parameter costs on its stage, in multiples of its size: the
  /// value, its gradient and optimizer state (SGD with momentum: 3).
  double parameter_copies = 2.0;
  /// Micro-batches whose activations a stage may hold at once (GPipe: all
  /// of them; 1F1B: at most the number of stages).
  std::size_t activations_in_flight = 1;
};

/// The contiguous split of `profile` into `options.stages` non-empty stages
/// that minimises the slowest stage's forward + backward time such that
/// every stage fits its memory cap (dynamic programming over split points,
/// as torchgpipe's balance_by_time and PipeDream's partitioner; O(p n^2)).
/// Ties go to the split that places layers as early as possible. Errors:
/// more stages than layers, a cap count that differs from the stage count
/// (errc::invalid_argument), no split fitting the caps (the message names
/// the smallest stage that cannot fit).
expected<partition> balance_by_profile(const std::vector<layer_profile>& profile,
                                       const balance_options& options);

/// profile_layers on `sample` (one micro-batch), then balance_by_profile:
/// the automatic partition in one call (torchgpipe's balance_by_time).
expected<partition> balance_by_time(nn::sequential& model, const tensor& sample,
                                    const balance_options& options,
                                    const profile_options& profiling = {});

/// Fills predicted_ms / predicted_bytes of `split` from `profile` (for
/// printing a manual partition beside the automatic one).
partition with_prediction(partition split, const std::vector<layer_profile>& profile,
                          const balance_options& options = {});

/// One line per stage: "stage 1: layers [3, 8), predicted 1.204 ms, 2.1 MiB"
/// (the prediction only when known), and ", measured X ms" when
/// `measured_ms` has an entry for the stage.
std::string to_string(const partition& split, const std::vector<double>& measured_ms = {});

} // namespace troupe::parallel
