#pragma once
// The pipeline's driver state behind parallel::pipeline (pipeline.hpp):
// the stage actors, the blocking actor through which the calling thread
// talks to them, and the step bookkeeping. Internal: the public header
// holds no CAF type.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "finish_hook.hpp"
#include "stage.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/autograd/nn/deferred_init.hpp"
#include "troupe/parallel/pipeline.hpp"

namespace troupe::parallel {

struct pipeline::state {
  /// Checks the options (usage_error naming the value) and fills the
  /// partition when it is empty.
  static void validate(pipeline_options& options);

  /// Validates the options and starts the stages; those in other processes
  /// through the node factory `stage_factory` (remote.hpp's, or a
  /// tensor_parallel_pipeline's). pipeline::create, and whoever wraps the
  /// result in a pipeline, take it from here.
  /// `pending_values`: the deferral options.model was built under (a model
  /// made from a recipe for its stages, kept_layers.hpp); the stages in this
  /// process materialize their slices from it, the others never draw.
  static expected<std::unique_ptr<state>> started(actors::node& node, pipeline_options options,
                                                  std::string stage_factory = stage_factory_name,
                                                  nn::deferred_init* pending_values = nullptr);

  state(actors::node& node, pipeline_options options);
  /// Forgets the job's finish hook and stops the stages.
  ~state();
  state(const state&) = delete;
  state& operator=(const state&) = delete;

  /// Spawns and wires the stages; those in this process materialize their
  /// slices of options_.model from `pending_values` when it is given.
  expected<void> start(nn::deferred_init* pending_values);
  expected<double> train_step(const tensor& inputs, const tensor& targets);
  expected<tensor> forward(const tensor& inputs);
  expected<void> synchronize();
  expected<std::vector<stage_stats>> stats();
  expected<std::vector<double>> parameter_digests();

  /// Each stage's writer name in checkpoints ("worker1-cpu-stage1").
  std::vector<std::string> checkpoint_writers() const;
  /// Every stage saves its layers and optimizer state (p_save, in parallel)
  /// as its checkpoint writer; stage s's state is held alike by
  /// `state_holders[s]` (its replicas' writers; empty: it alone), every
  /// optimizer's step count by `step_holders`. Waits for the stages'
  /// updates first. Errors name the stage.
  /// Sharded (a tensor_parallel_pipeline's stages): each stage saves its
  /// tensor-parallel pieces, stage s's split ones held alike by
  /// split_holders[s].
  expected<void> save_stages(const std::filesystem::path& root, std::uint64_t step,
                             const std::vector<std::vector<std::string>>& state_holders,
                             const std::vector<std::string>& step_holders, bool asynchronous, bool sharded = false,
                             const std::vector<std::vector<std::string>>& split_holders = {});
  /// Every stage loads its layers and optimizer state from `directory`
  /// (sharded: the regions of its pieces).
  expected<void> load_stages(const std::filesystem::path& directory, bool sharded = false);
  /// Sends `request(i)` to every stage i at once and waits for each reply
  /// (a message, "" when done); the first failure, naming its stage.
  expected<void> ask_every_stage(std::string_view verb, errc refused,
                                 const std::function<caf::message(std::size_t)>& request);

  /// Stops the stages and frees their names: the destructor's work, also
  /// run by the job's finish() when the pipeline outlives it. Idempotent.
  void shutdown();
  /// Has the job stop this pipeline at its finish().
  void stop_with(troupe::job& job);

  /// Per stage, every replica's reducer place (empty without replication).
  std::vector<std::vector<std::string>> replica_rings() const;
  /// Waits for the replies of `step` (0: none, only the previous step's
  /// updates still running); fills `losses`.
  expected<void> await_step(std::uint64_t step, std::vector<double>& losses);
  expected<void> fail(troupe::error err);
  /// What stats() and parameter_digests() wait for first: synchronize(),
  /// whose failure they report, unless the pipeline had already failed.
  expected<void> ready_for_query();
  /// A tensor from the driver to stage `index` (local send or the sender).
  expected<void> send_to_stage(std::size_t index, actors::tensor_message message);

  struct driver;
  actors::node& node_;
  pipeline_options options_;
  /// The node factory that builds a stage in another process (started()).
  std::string stage_factory_ = stage_factory_name;
  finish_hook finish_hook_;
  bool shut_down_ = false;
  std::unique_ptr<driver> driver_;
  std::vector<caf::actor> stages_;
  std::vector<std::string> names_;
  std::vector<actors::place> places_;
  actors::place driver_place_;
  trace::name_id driver_trace_;
  /// Across processes: the driver's sends through its router.
  tensor_sender sender_;
  std::uint64_t peer_lost_handler_ = 0;
  /// Nodes of the pipelines stepped together with this one
  /// (concurrent_pipelines.hpp): their stages meet this one's in
  /// collectives, so losing one stalls this step too, and the step fails
  /// at once instead of at the timeout.
  std::vector<std::string> linked_nodes_;
  /// Whether `node` hosts a stage of a pipeline stepped with this one.
  bool linked(const std::string& node) const;
  std::vector<trace::name_id> stage_traces_;
  std::uint64_t step_ = 0;
  /// overlap_update: the step whose optimizer updates are still running
  /// (0: none) and how many stages reported theirs so far.
  std::uint64_t updating_step_ = 0;
  std::size_t updates_seen_ = 0;
  /// Set once a step failed: the stages' state is no longer consistent.
  std::optional<troupe::error> broken_;
};

/// What tests reach behind the public surface.
struct pipeline_access {
  /// Stage `index`'s actor (tests kill it to check failure handling).
  static caf::actor stage_actor(const pipeline& p, std::size_t index) { return p.state_->stages_.at(index); }
  /// The driver's state (parallel::checkpoints saves and loads through it).
  static pipeline::state& state(pipeline& p) { return *p.state_; }
};

} // namespace troupe::parallel
