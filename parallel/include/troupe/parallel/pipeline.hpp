#pragma once
// Pipeline-parallel training: a sequential model split into stage actors,
// trained with micro-batches under a credit-based schedule (issue 4).
//
// The job as in troupe/job.hpp; one stage per rank, the model, optimizer
// and loss from job.host_stages' recipe.
// From examples/pipeline_demo.cpp:
//
//   auto pipe = job.must(parallel::pipeline::create(
//     job, {.model = model, .places = job.places(where.to_string()), .split = split,
//           .schedule = parallel::schedule_named(schedule), .micro_batches = std::size_t(micro),
//           .overlap_update = overlap == 1}));
//   ...
//   for (auto step : job.steps(steps, done)) {
//     auto [x, y] = corpus.batch(data, batch, seq);
//     step.report(job.must(pipe.train_step(x, y), fmt::format("step {}", step.number())), batch);
//   }
//
// In one process (tests, a program without other ranks), a local job and
// `in_this_process` run every stage as an actor of this process.
// From tests/parallel/pipeline_test.cpp:
//
//   troupe::job job_ = troupe::job::local().value();
//   ...
//   o.in_this_process = true;
//   ...
//   auto p = pipeline::create(job_, std::move(o));
//
// A step is synchronous: the batch is cut into micro-batches along dim 0,
// gradients accumulate over all of them (micro-batch j weighted by b_j / B),
// and every stage then takes one optimizer step, so losses and parameters
// equal single-process training on the whole batch (up to float summation
// order).
//
// Placement. With `in_this_process` every stage runs in the calling process
// (local actors, tensors shared by reference) and places only name the
// stages ("worker0/cpu/stage1"). Otherwise (remote.hpp) each stage is
// spawned on its place's node by the "troupe.pipeline_stage" factory — every
// process builds the same model from the same seed and keeps its slice,
// the only layers it gives values (nn::deferred_init) —
// and tensors travel through the nodes' tensor routers; control messages
// (begin, losses, completions, apply) stay on the control plane. Stage code
// sends tensors through one interface either way.
//
// Failure. Every wait has `options.timeout`; a stage that dies (its actor
// exits, its process is killed: CAF's down message) or reports an error, or
// whose node is lost (node::on_peer_lost), makes train_step return an error
// naming the stage and the reason, and the pipeline refuses later steps.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/fwd.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/parallel/gradient_bucket.hpp"
#include "troupe/parallel/partition.hpp"
#include "troupe/parallel/schedule.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe {
class job;
}

namespace troupe::parallel {

/// The mean loss of one micro-batch: output of the last stage and the
/// micro-batch's targets. The pipeline weights micro-batch j by b_j / B, so
/// its gradients and loss equal those of the full batch's mean loss.
using loss_function =
  std::function<autograd::variable(const autograd::variable& output, const tensor& target)>;

/// Builds an optimizer over a stage's named parameters (the names of the
/// whole model, so optimizer state maps back onto the full model).
using optimizer_factory =
  std::function<std::unique_ptr<optim::optimizer>(optim::named_variables parameters)>;

/// When a stage recomputes its forward in backward (activation
/// checkpointing) instead of stashing every layer's output.
enum class rematerialization : std::uint8_t {
  never,
  always,
  all_but_last_stage, ///< the last stage runs backward right after forward: nothing to save
};

/// A stage's statistics of the last step, and totals.
struct stage_stats {
  /// The most bytes of activations held at once for in-flight micro-batches:
  /// each stashed micro-batch's input and every layer output its graph keeps
  /// (only input and output with recomputation).
  std::uint64_t peak_stashed_bytes = 0;
  /// The most bytes held at once for deferred weight gradients (each
  /// micro-batch's layer inputs and output gradients until the step's last
  /// backward; 0 without deferral).
  std::uint64_t peak_deferred_bytes = 0;
  std::uint64_t peak_in_flight = 0;
  /// Time spent computing (forward, backward, optimizer) in the last step.
  double busy_ms = 0;
  /// The part of busy_ms spent on weight gradients computed while the stage
  /// had no forward or backward to run (fill_idle_with_weight_gradients).
  double fill_ms = 0;
  /// busy_ms and fill_ms summed over every step since the stage began:
  /// with overlap_update, the difference across a run of steps measures
  /// them without waiting for each step's updates.
  double total_busy_ms = 0;
  double total_fill_ms = 0;
};

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
  std::size_t bucket_bytes = bucket_options{}.bucket_bytes;
  /// Tells apart the rings of pipelines whose stages share places (a
  /// tensor-parallel pipeline's tensor ranks): the reducer is then
  /// `<places[k][s]>/<tag>.r<k>.stage<s>.reducer`.
  std::string tag{};
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
  /// Every stage is an actor of this process, whatever its place (places
  /// only name the stages; with `places` empty, every stage on the job's
  /// first place). Off: each stage is spawned on its place's node, which
  /// must have the stage factory registered (remote.hpp; the job does it).
  bool in_this_process = false;
  /// Every stage runs its work in the schedule's fixed order
  /// (schedule_policy::fixed_order) instead of as it becomes ready: for
  /// stages that make collectives with other pipelines' stages
  /// (tensor_parallel_pipeline sets it).
  bool fixed_order = false;
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
  /// A pipeline over the job's processes: what `options` leaves unset comes
  /// from the job — the model, optimizer and loss from its stage recipe
  /// (job::host_stages), one stage per rank in rank order. Validates the
  /// options (usage_error with a message naming the value: places vs
  /// partition size, a partition that does not cover the model, missing
  /// optimizer or loss) and starts the stages; runtime errors (a stage that
  /// does not answer) are values. The job stops the pipeline at finish().
  static expected<pipeline> create(troupe::job& job, pipeline_options options);
  /// The same on a node of the program's own (`node` outlives the pipeline);
  /// nothing comes from a job.
  static expected<pipeline> create(actors::node& node, pipeline_options options);

  /// Stops the stages (waiting for their last updates first).
  ~pipeline();
  pipeline(pipeline&&) noexcept;
  pipeline& operator=(pipeline&&) noexcept;

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

  std::size_t stages() const noexcept;
  const partition& split() const noexcept;
  /// "worker0/cpu/stage1".
  const std::string& stage_name(std::size_t index) const;
  std::uint64_t steps() const noexcept;

private:
  friend class hybrid_pipeline;
  friend class tensor_parallel_pipeline;
  friend struct pipeline_access;
  struct state;
  explicit pipeline(std::unique_ptr<state> st);
  std::unique_ptr<state> state_;
};

} // namespace troupe::parallel
