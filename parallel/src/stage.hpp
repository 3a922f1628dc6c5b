#pragma once
// A pipeline stage (internal: the pipeline's driver and the stage factory
// spawn it): one actor owning a contiguous slice of the model, an
// optimizer over the slice's parameters, and the stash of every in-flight
// micro-batch's graph (docs/design.md, "Actors and how a training step flows").
//
// Protocol (driver = the pipeline's blocking actor; atoms below):
//   (p_wire, prev, next, driver, prev place, next place, driver place) -> ok
//                                                neighbours and driver (once)
//   (p_begin, step, batch)                       a step of `batch` samples begins;
//                                                tensors of a step not yet begun wait
//                                                for it (tensors and control messages
//                                                may travel on different planes)
//   tensor_message forward_activation            x of (step, mb); context_id = step
//                                                (context_id 0: evaluation, no graph)
//   tensor_message control (last stage)          the target of (step, mb)
//   tensor_message backward_gradient             dy of (step, mb)
//   (p_stats)                        -> (peak stashed bytes, peak in flight, busy ms,
//                                        peak deferred bytes, fill ms, total busy ms,
//                                        total fill ms)
//   (p_digest)                       -> (sum of p + p^2 over the stage's parameters)
//   (p_save, root, step, writer, model holders, step holders, asynchronous,
//    sharded, split holders)
//                                    -> (why, "" when done): writes the stage's layers and
//                                       optimizer state as `writer`'s shard of step's
//                                       checkpoint (training_state.hpp); holders are
//                                       writer names joined by ','. Asynchronous: the
//                                       state is copied, the reply comes at once and
//                                       the shard is written on the stage's writer
//                                       thread (an earlier write's failure is the
//                                       reply to the next save). Sharded (a stage of a
//                                       tensor_parallel_pipeline): its pieces with their
//                                       global shapes, a split parameter's held alike by
//                                       `split holders`, what it holds whole by `model holders`
//   (p_load, checkpoint directory, sharded)
//                                    -> (why, "" when done): loads them, by name (sharded:
//                                       the regions its pieces cover)
// and towards the driver:
//   (p_loss, step, mb, loss)         last stage: the micro-batch's mean loss
//   (p_mbdone, step, mb)             first stage: backward of mb finished
//   (p_applied, stage, step)         the stage's last backward of the step ran, and
//                                    then its optimizer step and zero_grad (no
//                                    other stage's work is needed for it)
//   (p_failed, stage, step, what)    a handler threw; the step cannot finish
//   tensor_message forward_activation with context_id 0 (last stage): evaluation output
//
// Handling. Every tensor that arrives goes into the stage's work_queue; the
// stage then sends itself one `p_run` and runs ONE piece of work per p_run,
// so every message already in the mailbox is queued before the next choice
// and the schedule's priority (backward first for 1F1B) sees it. With no
// forward or backward runnable, a p_run computes one kept weight gradient
// (fill_idle_with_weight_gradients). Stages are spawned `detached`: compute
// never blocks CAF's scheduler.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/behavior.hpp>
#include <caf/fwd.hpp>

#include "troupe/actors/fwd.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/actors/tensor_message.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/parallel/gradient_bucket.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/schedule.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

using wire_atom = caf::atom_constant<caf::atom("p_wire")>;
using begin_step_atom = caf::atom_constant<caf::atom("p_begin")>;
using applied_atom = caf::atom_constant<caf::atom("p_applied")>;
using run_atom = caf::atom_constant<caf::atom("p_run")>;
using stats_atom = caf::atom_constant<caf::atom("p_stats")>;
using digest_atom = caf::atom_constant<caf::atom("p_digest")>;
using save_atom = caf::atom_constant<caf::atom("p_save")>;
using load_atom = caf::atom_constant<caf::atom("p_load")>;
using peer_lost_atom = caf::atom_constant<caf::atom("p_lost")>;
using loss_atom = caf::atom_constant<caf::atom("p_loss")>;
using micro_batch_done_atom = caf::atom_constant<caf::atom("p_mbdone")>;
using stage_failed_atom = caf::atom_constant<caf::atom("p_failed")>;

/// A neighbour of a stage: where it lives and (when known) its handle.
struct stage_endpoint {
  std::size_t index = 0;
  actors::place where;
  caf::actor handle;
};

/// How a stage sends a tensor to a neighbour or the driver. The only way a
/// stage's tensors leave it: in one process a plain CAF message (zero copy),
/// across processes the node's tensor_router. The sender also records the
/// send in the trace (the router does for routed sends), so a send is
/// recorded once whichever plane carries it.
using tensor_sender = std::function<expected<void>(const stage_endpoint& to, actors::tensor_message message)>;

/// Sends through `router` to the endpoint's place (its handle is unused).
/// `sender_name` names the sending actor in traces ("worker0/cpu/stage1").
tensor_sender routed_tensor_sender(std::shared_ptr<actors::tensor_router> router, std::string_view sender_name = {});

/// Sends with a local CAF message to `to.handle` (zero copy in process;
/// CAF's own serialization when the handle is remote); `sender_name` names
/// the sending actor in traces.
tensor_sender local_tensor_sender(std::string_view sender_name = {});

/// A replicated stage (pipeline x data parallel): the stage's replicas form
/// a reducer ring, and the stage averages its gradients with them
/// (data_parallel.hpp) while the backward of its step's last micro-batch
/// runs, before its optimizer step. The ring is joined at the stage's first
/// step, on the stage's own thread.
struct stage_replication {
  /// This replica's rank in the ring.
  std::uint32_t rank = 0;
  /// Every replica's reducer place for this stage, by rank; empty: none.
  std::vector<std::string> ring;
  /// The node the reducer lives on (this stage's process).
  actors::node* node = nullptr;
  std::size_t bucket_bytes = bucket_options{}.bucket_bytes;
  std::chrono::milliseconds timeout{30000};
};

struct stage_options {
  std::size_t index = 0;
  std::size_t stages = 1;
  /// The stage's layers (a slice sharing the model's modules).
  std::shared_ptr<nn::sequential> layers;
  std::unique_ptr<optim::optimizer> optimizer;
  /// Where the stage's layers, optimizer state and activations live: its
  /// place's device. The layers are moved there before the stage starts;
  /// every tensor that arrives (activation, gradient, target) is moved there.
  troupe::device device = troupe::device::cpu();
  /// Used by the last stage only.
  loss_function loss;
  bool rematerialize = false;
  /// Weight gradients computed once per step, after the stage's last
  /// backward (autograd/deferred_weight_grads.hpp).
  bool defer_weight_gradients = false;
  /// With deferral: while no forward or backward can run, the stage
  /// computes kept weight gradients one weight at a time (pipeline_options).
  bool fill_idle_with_weight_gradients = false;
  schedule_policy policy;
  tensor_sender sender;
  /// Where the stage lives, for error messages and traces ("worker0/cpu/stage1").
  std::string name;
  /// Hybrid parallelism: this stage is one replica of a stage replicated
  /// over several pipelines. Empty: not replicated.
  stage_replication replication;
};

/// The node factory that builds a stage from a stage_spec (remote.hpp).
inline constexpr const char* stage_factory_name = "troupe.pipeline_stage";

/// What a process needs to build stage `index` from its own copy of the
/// model: the arguments of the "troupe.pipeline_stage" factory (remote.hpp).
struct stage_spec {
  std::uint64_t index = 0;
  std::uint64_t stages = 1;
  std::uint64_t begin = 0; ///< first layer
  std::uint64_t end = 0;   ///< one past the last layer
  std::uint64_t credits = 1;
  bool backward_first = true;
  bool fixed_order = false;
  std::uint64_t micro_batches = 1; ///< per step, for the fixed order
  bool rematerialize = false;
  bool defer_weight_gradients = false;
  bool fill_idle_with_weight_gradients = false;
  /// Hybrid: the replica's rank, every replica's reducer place joined by
  /// ',' ("" when the stage is not replicated), bucket cap, timeout (ms).
  std::uint64_t replica_rank = 0;
  std::string ring;
  std::uint64_t bucket_bytes = bucket_options{}.bucket_bytes;
  std::uint64_t ring_timeout_ms = 30000;
};

caf::message to_message(const stage_spec& spec);
/// Errors (the message comes from another process): wrong element types,
/// an empty or inverted layer range, index >= stages, zero credits, a ring
/// with an unparsable place or too few members for the rank, a zero bucket
/// cap or timeout.
expected<stage_spec> stage_spec_from(const caf::message& message);
/// The spec's ring, split and validated (empty when not replicated).
expected<std::vector<std::string>> ring_places(const stage_spec& spec);

/// A stage in this process built from a spec received from the driver: its
/// `layers` (already sliced) moved to the place's device, their optimizer,
/// the routed sender, the spec's schedule and replication. For the node
/// factories of remote.cpp and tensor_parallel_pipeline.cpp.
std::shared_ptr<stage_options> stage_from_spec(const stage_spec& spec, const actors::place& where,
                                               actors::node& node, std::shared_ptr<nn::sequential> layers,
                                               const optimizer_factory& optimizer, loss_function loss);

/// stage_stats (pipeline.hpp): of the last step, reset by p_begin.

/// The stage actor's behaviour; spawn it detached:
///   sys.spawn<caf::detached>(stage_actor, std::make_shared<stage_options>(...))
caf::behavior stage_actor(caf::event_based_actor* self, std::shared_ptr<stage_options> options);

} // namespace troupe::parallel
