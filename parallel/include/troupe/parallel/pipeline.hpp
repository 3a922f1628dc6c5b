#pragma once
// Pipeline-parallel training: a sequential model split into stage actors,
// trained with micro-batches under a credit-based schedule (issue 4).
//
// The job as in troupe/job.hpp; one stage per rank, the model, optimizer
// and loss from job.host_stages' recipe.
// From examples/pipeline_demo.cpp:
//
//   auto pipe = job.must(parallel::pipeline::create(
//     job, {.model = model, .split = split, .schedule = parallel::schedule_named(schedule),
//           .micro_batches = std::size_t(micro), .overlap_update = overlap == 1}));
//   for (auto step : job.steps(steps)) {
//     auto [x, y] = corpus.batch(data, batch, seq);
//     step.report(job.must(pipe->train_step(x, y), fmt::format("step {}", step.number())), batch);
//   }
//
// In one process, create(caf::actor_system&, options) with places that name
// the stages ("worker0/cpu") runs them as local actors (the tests do).
//
// A step is synchronous: the batch is cut into micro-batches along dim 0,
// gradients accumulate over all of them (micro-batch j weighted by b_j / B),
// and every stage then takes one optimizer step, so losses and parameters
// equal single-process training on the whole batch (up to float summation
// order).
//
// Placement. Without `options.node` every stage runs in the calling process
// (local actors, tensors shared by reference) and places only name the
// stages ("worker0/cpu/stage1"). With a node (remote.hpp), each stage is
// spawned on its place's node by the "troupe.pipeline_stage" factory — every
// process builds the same model from the same seed and keeps its slice —
// and tensors travel through the nodes' tensor routers; control messages
// (begin, losses, completions, apply) stay on CAF. Stage code sends tensors
// only through a `tensor_sender` (stage.hpp), so it is the same code either
// way.
//
// Failure. Every wait has `options.timeout`; a stage that dies (its actor
// exits, its process is killed: CAF's down message) or reports an error, or
// whose node is lost (node::on_peer_lost), makes train_step return an error
// naming the stage and the reason, and the pipeline refuses later steps.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "troupe/actors/fwd.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/parallel/partition.hpp"
#include "troupe/parallel/schedule.hpp"
#include "troupe/parallel/stage.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe {
class job;
}

namespace troupe::parallel {

/// Rows of each micro-batch of a `batch`-row batch: `micro_batches` equal
/// parts (the first batch % m one row larger) without shares, else parts
/// proportional to the shares (largest remainders rounded up). Throws
/// usage_error for a share that is not a positive finite number, a share
/// count that is not `micro_batches`, or a micro-batch left without rows.
std::vector<std::int64_t> micro_batch_rows(std::int64_t batch, std::size_t micro_batches,
                                           const std::vector<double>& shares);
/// The share checks of micro_batch_rows alone (pipeline::create runs them).
void check_micro_batch_shares(std::size_t micro_batches, const std::vector<double>& shares);

/// SGD over a stage's parameters.
optimizer_factory sgd_factory(optim::sgd_options options);
/// Adam (or AdamW with `decoupled`) over a stage's parameters.
optimizer_factory adam_factory(optim::adam_options options, bool decoupled = false);

/// Mean squared error against a float target.
loss_function mse_loss_function();
/// Mean cross entropy of logits against int64 class indices.
loss_function cross_entropy_loss_function();

/// Hybrid parallelism (pipeline x data parallel): this pipeline is replica
/// `index` of several pipelines of the same model and partition, each fed
/// its own shard of the batch; stage s of every replica joins one reducer
/// ring (stage_replication), so each stage averages its gradients with its
/// replicas before its optimizer step. hybrid.hpp builds the replicas.
struct pipeline_replication {
  std::uint32_t index = 0;
  /// Every replica's stage places, [replica][stage]; row `index` must equal
  /// pipeline_options::places. Stage s of replica k keeps its reducer at
  /// `<places[k][s]>/r<k>.stage<s>.reducer`.
  std::vector<std::vector<std::string>> places;
  /// In one process (no pipeline_options::node): the node the reducers use.
  actors::node* node = nullptr;
  std::size_t bucket_bytes = bucket_options{}.bucket_bytes;
};

struct pipeline_options {
  /// The model; stages hold slices sharing its modules, so after training
  /// `model` holds the trained parameters.
  std::shared_ptr<nn::sequential> model{};
  /// One place per stage: "<node>/<device>" ("worker0/cpu").
  std::vector<std::string> places{};
  /// Stages' layers; empty boundaries: an even split over the places.
  partition split{};
  schedule_kind schedule = schedule_kind::one_f_one_b;
  std::size_t micro_batches = 1;
  /// Relative sizes of the micro-batches (one positive number each, so
  /// `micro_batches` of them); empty: equal parts. A small first
  /// micro-batch fills the pipeline sooner while the others stay large
  /// enough for efficient GEMMs: on bench/pipeline's MLP, {3, 6.5, 6.5}
  /// (48, 104 and 104 of 256 rows) beat every equal split.
  std::vector<double> micro_batch_shares{};
  optimizer_factory optimizer{};
  loss_function loss{};
  /// Which stages recompute their forward in backward.
  rematerialization remat = rematerialization::never;
  /// Each stage computes its linear layers' weight gradients once per step,
  /// over all micro-batches, right after its last backward, instead of once
  /// per micro-batch (autograd/deferred_weight_grads.hpp): fewer, larger
  /// GEMMs, and the last stages do it while the first ones still run their
  /// backward. The cost is memory: each linear layer's input and output
  /// gradient are kept for every micro-batch of the step (under 1F1B, m
  /// micro-batches instead of the stage's credits; stage_stats::
  /// peak_deferred_bytes reports it). Off: per micro-batch, as in plain
  /// backward().
  bool defer_weight_gradients = true;
  /// With deferral: whenever a stage has no forward or backward it can run
  /// (waiting for its neighbours: the pipeline's bubble), it computes the
  /// weight gradient of one kept weight over the micro-batches kept so far,
  /// and the step's last backward computes only what is left. This is the
  /// zero-bubble schedules' W filling the bubble (Qi et al., 2023); it also
  /// lowers the memory deferral holds. Results equal per-micro-batch backward
  /// up to float summation order, which now depends on timing. Off: every
  /// weight gradient after the stage's last backward.
  bool fill_idle_with_weight_gradients = true;
  /// train_step returns as soon as every micro-batch's loss and backward
  /// are in, while each stage finishes its step (the weight gradients still
  /// kept, the optimizer step) in the background; the next train_step's
  /// micro-batches queue behind that work in each stage's mailbox, so they
  /// see the updated parameters and the step equals the synchronous one.
  /// What it buys: the last stage's weight gradients (a third of its work)
  /// run while the first stage computes the next step's first forward,
  /// which the last stage would otherwise wait for idle (the pipeline's
  /// fill, once per step). What it costs: after train_step returns, the
  /// model's parameters may still be changing; forward(), stats(),
  /// parameter_digests() and the destructor wait for them (synchronize()),
  /// but code that reads the model's tensors directly (in one process) must
  /// call synchronize() first. A failure of that background work is
  /// reported by the next call. Off: train_step returns after every
  /// stage's optimizer step.
  bool overlap_update = false;
  /// Bound on every wait of train_step and forward (the time between two
  /// progress messages, not for the whole step).
  std::chrono::milliseconds timeout{30000};
  /// Cross-process: this process's node (it must outlive the pipeline).
  /// Stages are spawned on their places' nodes, which must have the stage
  /// factory registered (remote.hpp, register_stage_factory).
  actors::node* node = nullptr;
  /// Prefix of the stage names ("<name>.stage1"), so that several pipelines
  /// can have stages on one node; empty: "stage1".
  std::string name{};
  /// Hybrid parallelism; none: the pipeline is not replicated.
  std::optional<pipeline_replication> replication{};
};

/// Each stage's busy time of the last step divided by its micro-batches:
/// the "measured" column beside a partition's prediction (to_string).
std::vector<double> per_micro_batch_ms(const std::vector<stage_stats>& stats, std::size_t micro_batches);

class pipeline {
public:
  /// Validates the options (usage_error with a message naming the value:
  /// places vs partition size, a partition that does not cover the model,
  /// missing optimizer or loss) and spawns the stages. Errors from the
  /// runtime (a stage that does not answer its wiring) are values.
  static expected<std::unique_ptr<pipeline>> create(caf::actor_system& system,
                                                    pipeline_options options);
  /// A pipeline over the job's processes: what `options` leaves unset comes
  /// from the job — the model, optimizer and loss from its stage recipe
  /// (job::host_stages), one stage per rank in rank order.
  static expected<std::unique_ptr<pipeline>> create(troupe::job& job, pipeline_options options);

  /// Stops the stages.
  ~pipeline();
  pipeline(const pipeline&) = delete;
  pipeline& operator=(const pipeline&) = delete;

  /// One synchronous training step on a batch; returns the batch's mean loss.
  /// Throws usage_error for inputs and targets whose batch sizes differ or
  /// a batch smaller than the micro-batch count. Errors: a stage failed,
  /// died or did not answer within the timeout (the message names it).
  expected<double> train_step(const tensor& inputs, const tensor& targets);

  /// The model's output for `inputs` (no graph, no parameter change),
  /// computed micro-batch by micro-batch through the stages.
  expected<tensor> forward(const tensor& inputs);

  /// Waits until every stage has taken the optimizer step of the last
  /// train_step (with overlap_update, train_step returns before that).
  /// Errors: as train_step's, for the work still running.
  expected<void> synchronize();

  /// Statistics of each stage's last step.
  expected<std::vector<stage_stats>> stats();

  /// Per stage, the sum of p + p^2 over its parameters: compares parameters
  /// held in other processes with a reference without moving them.
  expected<std::vector<double>> parameter_digests();

  std::size_t stages() const noexcept { return stages_.size(); }
  const partition& split() const noexcept { return options_.split; }
  /// The stage's actor (tests kill it to check failure handling).
  const caf::actor& stage_actor(std::size_t index) const { return stages_.at(index); }
  /// "worker0/cpu/stage1".
  const std::string& stage_name(std::size_t index) const { return names_.at(index); }
  std::uint64_t steps() const noexcept { return step_; }

private:
  friend class hybrid_pipeline;
  /// Stops the stages and frees their names: the destructor's work, also
  /// run by the job's finish() when the pipeline outlives it. Idempotent.
  void shutdown();
  /// Has the job stop this pipeline at its finish().
  void stop_with(troupe::job& job);
  troupe::job* job_ = nullptr;
  std::uint64_t finish_hook_ = 0;
  bool shut_down_ = false;
  pipeline(caf::actor_system& system, pipeline_options options);
  expected<void> start();
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
  caf::actor_system& system_;
  pipeline_options options_;
  std::unique_ptr<driver> driver_;
  std::vector<caf::actor> stages_;
  std::vector<std::string> names_;
  std::vector<actors::place> places_;
  actors::place driver_place_;
  trace::name_id driver_trace_;
  /// With a node: the driver's sends through its router.
  tensor_sender sender_;
  std::uint64_t peer_lost_handler_ = 0;
  std::vector<trace::name_id> stage_traces_;
  std::uint64_t step_ = 0;
  /// overlap_update: the step whose optimizer updates are still running
  /// (0: none) and how many stages reported theirs so far.
  std::uint64_t updating_step_ = 0;
  std::size_t updates_seen_ = 0;
  /// Set once a step failed: the stages' state is no longer consistent.
  std::optional<troupe::error> broken_;
};

} // namespace troupe::parallel
