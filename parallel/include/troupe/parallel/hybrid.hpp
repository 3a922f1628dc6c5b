#pragma once
// Hybrid parallelism (issue 5): R replicas of one pipeline, stage s of every
// replica forming its own reducer ring, composed by placement alone.
//
// Every process as for a pipeline (pipeline.hpp); then on the driver.
// From examples/hybrid_demo.cpp:
//
//   auto hybrid = job.must(parallel::hybrid_pipeline::create(
//     job, {.replicas = std::size_t(replicas), .where = where,
//           .pipeline = {.split = split, .schedule = parallel::schedule_named(schedule),
//                        .micro_batches = std::size_t(micro), .overlap_update = overlap == 1}}));
//
// train_step takes the whole batch. With 4 processes and 2
// replicas, replica 0 is ranks 0 and 1 (stage 0, stage 1), replica 1 ranks
// 2 and 3; explicit `places` choose any other layout.
//
// Each replica is an ordinary pipeline (pipeline.hpp) named "r<k>" whose
// stages are spawned on their places by the stage factory; stage s of
// replica k joins the ring of stage s's replicas (pipeline_replication) at
// its first step. A step cuts the batch into R equal shards, runs the R
// pipelines' steps at once (one driver thread each), and each stage averages
// its gradients with its replicas while the backward of its last
// micro-batch runs, before its optimizer step. The result equals training
// on the whole batch in one process (up to float summation order); every
// replica of a stage ends bitwise identical.
//
// Failure: a stage or replica lost fails every replica's step within the
// timeout, with an error naming the stage (and, from the ring, the replica).
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/fwd.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/remote.hpp"

namespace troupe::parallel {

struct hybrid_options {
  /// With `places` empty (create from a job): the job's ranks cut into this
  /// many replicas of consecutive ranks, replica k's stage s on rank
  /// k * stages + s.
  std::size_t replicas = 0;
  /// [replica][stage] places ("<node>/<device>"); at least two replicas,
  /// every replica with the same number of stages.
  std::vector<std::vector<std::string>> places{};
  /// With `places` empty: the device of every rank's place (`cuda:0`: each
  /// stage on its rank's machine's first GPU; replicas of a stage sharing a
  /// GPU then average through the host, as data_parallel decides).
  device where = device::cpu();
  /// The pipeline every replica runs: split, schedule, micro-batches,
  /// rematerialization, deferral, overlap_update, timeout. Its model,
  /// optimizer and loss come from `recipe`, its places from `places` (leave
  /// them unset). With overlap_update, train_step returns before the
  /// stages' updates (and so before their gradient averaging) are done;
  /// synchronize() waits for them.
  pipeline_options pipeline{};
  /// What every process builds (register_stage_factory with the same recipe
  /// on every node that hosts a stage, this one included); from a job: the
  /// job's recipe when this one has no model.
  stage_recipe recipe{};
  /// Gradient bucket cap of each stage's data parallelism.
  std::size_t bucket_bytes = bucket_options{}.bucket_bytes;
};

class hybrid_pipeline {
public:
  /// Validates the layout (usage_error naming the value) and creates the
  /// replicas' pipelines.
  static expected<hybrid_pipeline> create(actors::node& node, hybrid_options options);
  /// Over the job's processes: the recipe from job::host_stages when
  /// `options.recipe` has no model, places from `replicas` when empty.
  static expected<hybrid_pipeline> create(troupe::job& job, hybrid_options options);

  /// One synchronous step on the whole batch, cut into equal shards (rows a
  /// multiple of the replicas, each shard at least `micro_batches` rows, or
  /// usage_error): the mean loss over the batch. Errors name the replica
  /// and stage that failed.
  expected<double> train_step(const tensor& inputs, const tensor& targets);

  /// Waits until every replica's stages took their last optimizer step
  /// (pipeline::synchronize); errors name the replica.
  expected<void> synchronize();

  std::size_t replicas() const noexcept { return replicas_.size(); }
  pipeline& replica(std::size_t k) { return replicas_.at(k); }

private:
  hybrid_pipeline() = default;
  std::vector<pipeline> replicas_;
};

} // namespace troupe::parallel
