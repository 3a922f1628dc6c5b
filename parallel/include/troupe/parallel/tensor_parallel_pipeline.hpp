#pragma once
// Tensor x pipeline (x data) parallelism (issue 20): a pipeline whose every
// stage is itself split over a tensor-parallel group, laid out as a mesh
// (mesh.hpp) with Megatron-LM's axes, outermost first:
//
//   {"data", D}, {"pipeline", P}, {"tensor", T}    rank = (d P + p) T + t
//
// so the T ranks of one stage of one replica share a tensor-parallel group
// (innermost), the P stages of one replica and tensor rank form a
// pipeline, and the D replicas of one stage and tensor rank form a
// data-parallel ring.
// From tests/parallel/tensor_parallel_pipeline_test.cpp:
//
//   auto made = tensor_parallel_pipeline::create(
//       job, {.tensor = 2, .data = data,
//                    .model = [&](reducer_group& group) {
//                      return std::make_shared<parallel_gpt>(config, group, tensor_parallel_options{sequence_parallel});
//                    },
//                    .loss = vocab_parallel_loss,
//                    .pipeline = {.places = places, .micro_batches = 2,
//                                 .optimizer = sgd_factory({.lr = 0.1}), .in_this_process = true}});
//   ...
//     auto loss = tp.train_step(ids, targets);
//
// with one place per stage: {"worker0/cpu", "worker0/cpu"}, or
// {"worker0/cuda:0", "worker0/cuda:0"} to hold every stage's pieces on a
// GPU (the layers' collectives then go through the host,
// tensor_parallel_collectives.hpp).
//
// How. Each (replica d, tensor rank t) runs an ordinary pipeline
// (pipeline.hpp) over the P stages; stage p of it holds tensor rank t's
// pieces of stage p's layers, built over the group of (d, p, *): the
// model factory builds the whole model over that group and the stage keeps
// its slice (as every process of a remote pipeline builds the model and
// keeps its slice). The T pipelines of a replica take the same batch; the
// layers' collectives (tensor_parallel_collectives.hpp) meet in the
// stages' groups. Every stage runs its micro-batches in the schedule's
// fixed order (schedule_policy::fixed_order), since the members of a group
// must make the same collectives in the same order and arrival order
// differs by rank. With D > 1 each replica takes an equal shard of the
// batch, and stage p of tensor rank t averages its pieces' gradients with
// the same stage and rank of the other replicas (pipeline_replication)
// before its optimizer step. Losses and parameters equal one process's
// training on the whole batch, within float summation order (tested: 2
// stages x 2 tensor ranks, and x 2 replicas, sequence parallelism on and
// off, against nn::gpt).
//
// Across processes (in_this_process unset, created from the job): every
// rank of the job calls create() with the same options and is one rank of
// the mesh, so the processes number D x P x T and fix P. Each rank joins
// its tensor-parallel group, builds the model over it and keeps its stage;
// once every rank has, the driver (rank 0) starts the D x T pipelines,
// whose stages are the ranks' prepared ones, and the other ranks serve:
// From examples/tensor_parallel_demo.cpp:
//
//   auto tp = job.must(parallel::tensor_parallel_pipeline::create(
//     job, {.tensor = std::uint32_t(tensor_ranks), .data = std::uint32_t(replicas),
//           .model = [&](parallel::reducer_group& group) {
//           ...
//           .pipeline = {.places = job.places(where.to_string()), .micro_batches = std::size_t(micro),
//                        .optimizer = corpus.recipe().optimizer}}));
//   if (!job.is_driver()) return job.serve();
//
// Every build is a whole model (P per tensor rank in one process, one per
// process across processes) under nn::deferred_init: the layers a stage does
// not keep are built without values, taking no memory, and dropped.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "troupe/actors/fwd.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/parallel/mesh.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe {
class job;
}

namespace troupe::parallel {

/// The whole model split over `group` (parallel_gpt(config, group)); a
/// stage keeps its layers of it. Called once per stage and tensor rank.
using tensor_parallel_model_factory = std::function<std::shared_ptr<nn::sequential>(reducer_group& group)>;
/// The last stage's loss over its tensor-parallel group (a
/// vocabulary-parallel cross entropy needs it; others may ignore it).
using tensor_parallel_loss_factory = std::function<loss_function(reducer_group& group)>;

struct tensor_parallel_pipeline_options {
  /// Ranks of each tensor-parallel group (the "tensor" axis).
  std::uint32_t tensor = 1;
  /// Data-parallel replicas (the "data" axis).
  std::uint32_t data = 1;
  tensor_parallel_model_factory model{};
  tensor_parallel_loss_factory loss{};
  /// What every pipeline runs: one place per stage (their count is the
  /// "pipeline" axis), split, schedule, micro-batches, optimizer, timeout.
  /// Leave model, loss, name and replication unset. In one process
  /// (in_this_process): one place per stage. Across processes: every
  /// rank's place by rank, or none (the job's).
  pipeline_options pipeline{};
};

class tensor_parallel_pipeline {
public:
  /// Validates the options (usage_error naming the value), joins the
  /// groups, builds the models and starts the D x T pipelines; a group or
  /// stage that does not start is an error value.
  static expected<tensor_parallel_pipeline> create(actors::node& node, tensor_parallel_pipeline_options options);
  /// The same on the job's node; the job stops the pipelines at finish().
  /// Without in_this_process every rank calls it (above); a rank whose
  /// group or stage does not start, or that waits longer than the
  /// pipeline's timeout for the others, gets an error value.
  static expected<tensor_parallel_pipeline> create(troupe::job& job, tensor_parallel_pipeline_options options);

  ~tensor_parallel_pipeline();
  tensor_parallel_pipeline(tensor_parallel_pipeline&&) noexcept;
  tensor_parallel_pipeline& operator=(tensor_parallel_pipeline&&) noexcept;

  /// One synchronous step on the whole batch (rows a multiple of the
  /// replicas, or usage_error): the batch's mean loss. Errors name the
  /// replica and tensor rank whose pipeline failed.
  expected<double> train_step(const tensor& inputs, const tensor& targets);
  /// Waits for every pipeline's last optimizer step (overlap_update).
  expected<void> synchronize();

  /// The layout: axes "data", "pipeline", "tensor", and each rank's place.
  const mesh& layout() const;
  /// What replica `data`'s tensor rank `tensor` trains: its pieces of every
  /// stage's layers, by the whole model's names (pieces_equal compares it).
  /// In one process only (usage_error across processes).
  nn::sequential& model(std::uint32_t data, std::uint32_t tensor);
  /// Per stage, the sum of p + p^2 over replica `data`'s tensor rank
  /// `tensor`'s pieces (pipeline::parameter_digests): compares pieces held
  /// in other processes without moving them. On the driver.
  expected<std::vector<double>> parameter_digests(std::uint32_t data, std::uint32_t tensor);

private:
  friend struct tensor_parallel_pipeline_access; // checkpoints reach the pipelines (parallel/src)
  struct state;
  explicit tensor_parallel_pipeline(std::unique_ptr<state> st);
  static expected<tensor_parallel_pipeline> create_across_processes(troupe::job& job,
                                                                    tensor_parallel_pipeline_options options);
  /// "replica d, tensor rank t" of pipeline d T + t, for errors.
  std::string name(std::size_t k) const;
  std::unique_ptr<state> state_;
};

} // namespace troupe::parallel
