// The stage actor: forward and backward of its slice per micro-batch, picked
// from its work queue by the schedule's credits and priority.
#include "stage.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <string>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "training_state.hpp"

#include "troupe/actors/tensor_router.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/autograd/checkpoint.hpp"
#include "troupe/autograd/deferred_weight_grads.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/parallel/distributed_autograd.hpp"

namespace troupe::parallel {

tensor_sender local_tensor_sender(std::string_view sender_name) {
  const auto sender = sender_name.empty() ? trace::name_id{} : trace::intern(sender_name);
  return [sender](const stage_endpoint& to, actors::tensor_message message) -> expected<void> {
    if (!to.handle)
      return make_error(errc::invalid_argument, "stage {} ({}) has no actor handle", to.index,
                        to.where.to_string());
    if (trace::enabled()) {
      message.flow_id = trace::next_flow_id();
      trace::message_sent(sender, trace::message_info(actors::trace_kind(message.meta.kind),
                                                      trace::intern(to.where.name.empty() ? "driver"
                                                                                          : to.where.to_string()),
                                                      message.value.nbytes(), message.flow_id,
                                                      static_cast<std::uint32_t>(message.meta.step),
                                                      message.meta.micro_batch));
    }
    caf::anon_send(to.handle, std::move(message));
    return {};
  };
}

expected<std::vector<std::string>> ring_places(const stage_spec& spec) {
  std::vector<std::string> ring;
  if (spec.ring.empty())
    return ring;
  constexpr std::size_t max_replicas = 4096;
  for (std::size_t at = 0; at <= spec.ring.size();) {
    auto comma = std::min(spec.ring.find(',', at), spec.ring.size());
    auto text = spec.ring.substr(at, comma - at);
    auto parsed = actors::place::parse(text);
    if (!parsed || parsed->name.empty())
      return make_error(errc::malformed_message, "pipeline stage {}: reducer place {} of its ring is not "
                        "<node>/<device>/<name>", spec.index, ring.size());
    ring.push_back(std::move(text));
    if (ring.size() > max_replicas)
      return make_error(errc::size_limit_exceeded, "pipeline stage {}: a ring of more than {} replicas",
                        spec.index, max_replicas);
    at = comma + 1;
  }
  if (ring.size() < 2 || spec.replica_rank >= ring.size() || spec.bucket_bytes == 0 ||
      spec.ring_timeout_ms == 0)
    return make_error(errc::malformed_message,
                      "pipeline stage {}: replica {} of a ring of {} with buckets of {} bytes and a "
                      "{} ms timeout; need rank < ring size >= 2, buckets and timeout > 0",
                      spec.index, spec.replica_rank, ring.size(), spec.bucket_bytes, spec.ring_timeout_ms);
  return ring;
}

caf::message to_message(const stage_spec& spec) {
  return caf::make_message(spec.index, spec.stages, spec.begin, spec.end, spec.credits,
                           spec.backward_first, spec.fixed_order, spec.micro_batches, spec.rematerialize, spec.defer_weight_gradients,
                           spec.fill_idle_with_weight_gradients, spec.replica_rank, spec.ring,
                           spec.bucket_bytes, spec.ring_timeout_ms);
}

expected<stage_spec> stage_spec_from(const caf::message& message) {
  if (!message.match_elements<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t,
                              std::uint64_t, bool, bool, std::uint64_t, bool, bool, bool, std::uint64_t, std::string,
                              std::uint64_t, std::uint64_t>())
    return make_error(errc::malformed_message,
                      "pipeline stage: the spawn arguments are {} but must be (index, stages, "
                      "begin, end, credits, backward_first, fixed_order, micro_batches, rematerialize, defer_weight_gradients, "
                      "fill_idle_with_weight_gradients, replica_rank, ring, "
                      "bucket_bytes, ring_timeout_ms)",
                      caf::to_string(message));
  stage_spec spec;
  spec.index = message.get_as<std::uint64_t>(0);
  spec.stages = message.get_as<std::uint64_t>(1);
  spec.begin = message.get_as<std::uint64_t>(2);
  spec.end = message.get_as<std::uint64_t>(3);
  spec.credits = message.get_as<std::uint64_t>(4);
  spec.backward_first = message.get_as<bool>(5);
  spec.fixed_order = message.get_as<bool>(6);
  spec.micro_batches = message.get_as<std::uint64_t>(7);
  spec.rematerialize = message.get_as<bool>(8);
  spec.defer_weight_gradients = message.get_as<bool>(9);
  spec.fill_idle_with_weight_gradients = message.get_as<bool>(10);
  spec.replica_rank = message.get_as<std::uint64_t>(11);
  spec.ring = message.get_as<std::string>(12);
  spec.bucket_bytes = message.get_as<std::uint64_t>(13);
  spec.ring_timeout_ms = message.get_as<std::uint64_t>(14);
  if (auto ring = ring_places(spec); !ring)
    return ring.error_value();
  if (spec.index >= spec.stages || spec.begin >= spec.end || spec.credits == 0 || spec.micro_batches == 0)
    return make_error(errc::malformed_message,
                      "pipeline stage: stage {} of {} with layers [{}, {}), {} credits and {} micro-batches; need "
                      "index < stages, begin < end, credits >= 1 and micro-batches >= 1",
                      spec.index, spec.stages, spec.begin, spec.end, spec.credits, spec.micro_batches);
  return spec;
}

namespace {

using clock = std::chrono::steady_clock;

/// Ends a handler span of the trace when it leaves scope (if `active`),
/// also when the handler throws.
struct handler_end_guard {
  bool active;
  trace::name_id actor;
  trace::name_id kind;
  ~handler_end_guard() {
    if (active)
      trace::handler_end(actor, kind);
  }
};

/// Everything a stage keeps between messages. Used only from the stage's
/// own (detached) thread.
class stage_state {
public:
  explicit stage_state(std::shared_ptr<stage_options> options)
      : options_(std::move(options)), queue_(options_->policy),
        trace_name_(trace::intern(options_->name)) {}

  bool first() const noexcept { return options_->index == 0; }
  bool last() const noexcept { return options_->index + 1 == options_->stages; }

  void wire(caf::actor previous, caf::actor next, caf::actor driver) {
    previous_ = {options_->index - (first() ? 0 : 1), {}, std::move(previous)};
    next_ = {options_->index + 1, {}, std::move(next)};
    driver_ = std::move(driver);
  }
  /// Places of the endpoints, for a routed tensor sender ("" when unknown).
  void set_places(const std::string& previous, const std::string& next, const std::string& driver) {
    auto parse = [](const std::string& text) {
      auto parsed = actors::place::parse(text);
      return parsed ? *parsed : actors::place{};
    };
    previous_.where = parse(previous);
    next_.where = parse(next);
    driver_place_ = parse(driver);
  }

  void begin(std::uint64_t step, std::uint64_t batch) {
    if (step_ != step) {
      // A previous step that failed may have left work and graphs behind.
      queue_.clear();
      deferred_.clear();
      registry_.release_context(step_);
      waiting_for_target_.clear();
      targets_.clear();
      unread_losses_.clear();
      stash_bytes_.clear();
      stashed_ = 0;
    }
    step_ = step;
    batch_ = batch;
    rows_done_ = 0;
    micro_batch_rows_.clear();
    join_ring();
    busy_before_ms_ += stats_.busy_ms;
    fill_before_ms_ += stats_.fill_ms;
    stats_ = {};
    queue_.reset_peak();
    // Tensors of this step that overtook the begin message.
    auto early = std::move(early_);
    early_.clear();
    for (auto& message : early)
      if (message.meta.context_id == step)
        arrive(message);
      else if (message.meta.context_id > step)
        early_.push_back(std::move(message));
  }

  /// A tensor arrived: evaluation runs at once, training work is queued.
  void arrive(actors::tensor_message message) {
    // From the driver or a stage on another device (or from the host, when
    // it crossed processes): onto this stage's device first.
    if (message.value.defined() && message.value.where() != options_->device)
      message.value = message.value.to(options_->device);
    const context_key key{message.meta.context_id, message.meta.micro_batch, 0};
    if (message.meta.kind == message_kind::forward_activation && key.context_id == 0) {
      evaluate(message);
      return;
    }
    if (key.context_id > step_) {
      early_.push_back(message);
      return;
    }
    if (key.context_id < step_)
      return; // left over from a failed step
    if (message.meta.kind == message_kind::backward_gradient) {
      queue_.push(message);
      return;
    }
    if (!last()) {
      require(message.meta.kind == message_kind::forward_activation,
              "stage {}: unexpected {} message", options_->name, name_of(message.meta.kind));
      queue_.push(message);
      return;
    }
    // The last stage runs a forward only once its target is there too.
    if (message.meta.kind == message_kind::control) {
      // A target is taken as it arrives (no handler of its own).
      trace::message_received(trace_name_, trace::message_info(actors::trace_kind(message.meta.kind), {},
                                                               message.value.nbytes(), message.flow_id,
                                                               static_cast<std::uint32_t>(message.meta.step),
                                                               message.meta.micro_batch));
      if (auto it = waiting_for_target_.find(key); it != waiting_for_target_.end()) {
        targets_[key] = message.value;
        queue_.push(std::move(it->second));
        waiting_for_target_.erase(it);
      } else {
        targets_[key] = message.value;
      }
    } else if (targets_.count(key) != 0) {
      queue_.push(message);
    } else {
      waiting_for_target_.emplace(key, message);
    }
  }

  bool has_work() const noexcept { return queue_.has_runnable() || can_fill(); }

  /// Runs one piece of queued work, or, with none runnable, one weight's
  /// kept gradient.
  void run_one() {
    auto work = queue_.pop();
    if (!work) {
      if (can_fill())
        fill_one();
      return;
    }
    auto started = clock::now();
    // The trace shows the compute of each micro-batch as this stage's
    // handler (received when it runs, linked to its send by the flow id).
    // (The last stage's loss seed was never sent: a handler span only.)
    std::optional<actors::tensor_receive_scope> scope;
    if (work->flow_id != 0 || work->meta.kind != message_kind::backward_gradient || !last())
      scope.emplace(trace_name_, *work);
    else
      trace::handler_start(trace_name_, trace::message_info(actors::trace_kind(work->meta.kind), {}, 0, 0,
                                                            static_cast<std::uint32_t>(work->meta.step),
                                                            work->meta.micro_batch));
    handler_end_guard seed_span{!scope.has_value(), trace_name_,
                                actors::trace_kind(message_kind::backward_gradient)};
    if (work->meta.kind == message_kind::backward_gradient)
      backward(*work);
    else
      forward(*work);
    stats_.busy_ms += std::chrono::duration<double, std::milli>(clock::now() - started).count();
  }

  double digest() const {
    double sum = 0;
    for (const auto& p : options_->layers->parameters()) {
      auto values = p.data().to_vector<double>();
      for (double v : values)
        sum += v + v * v;
    }
    return sum;
  }

  stage_stats stats() const {
    auto out = stats_;
    out.peak_in_flight = queue_.peak_in_flight();
    out.total_busy_ms = busy_before_ms_ + stats_.busy_ms;
    out.total_fill_ms = fill_before_ms_ + stats_.fill_ms;
    return out;
  }

  /// Drops handles, graphs and the sender (the stage stopped).
  void release() {
    previous_ = {};
    next_ = {};
    driver_ = nullptr;
    queue_.clear();
    registry_ = {};
    waiting_for_target_.clear();
    targets_.clear();
    early_.clear();
    data_parallel_.reset();
    options_->sender = nullptr;
  }

  const stage_options& options() const noexcept { return *options_; }
  const caf::actor& driver() const noexcept { return driver_; }
  background_writer& checkpoint_writer() {
    if (!checkpoint_writer_)
      checkpoint_writer_ = std::make_shared<background_writer>();
    return *checkpoint_writer_;
  }
  std::uint64_t step() const noexcept { return step_; }

private:
  /// Kept weight gradients may fill idle time: only between the step's
  /// first and last backward. After the last one the rest is computed at
  /// once; with a replicated stage, hooks fired before it only accumulate
  /// (set_final_pass(false) at the previous backward).
  bool can_fill() const noexcept {
    return options_->fill_idle_with_weight_gradients && !deferred_.empty() && rows_done_ > 0 &&
           rows_done_ < batch_;
  }

  void fill_one() {
    static const auto kind = trace::intern("weight_gradients");
    auto started = clock::now();
    trace::handler_start(trace_name_, trace::message_info(kind, {}, 0, 0, static_cast<std::uint32_t>(step_),
                                                          trace::no_step));
    handler_end_guard span{true, trace_name_, kind};
    deferred_.flush_one();
    auto ms = std::chrono::duration<double, std::milli>(clock::now() - started).count();
    stats_.busy_ms += ms;
    stats_.fill_ms += ms;
  }

  /// Runs the slice on `x` with a graph; returns the output and adds the
  /// bytes the graph keeps for this micro-batch to the stash.
  autograd::variable run_layers(const autograd::variable& x, std::size_t& stashed) {
    stashed = x.data().nbytes();
    if (options_->rematerialize) {
      auto layers = options_->layers;
      auto outputs = autograd::checkpoint(
          [layers](const std::vector<autograd::variable>& in) {
            return std::vector<autograd::variable>{layers->forward(in[0])};
          },
          {x});
      stashed += outputs[0].data().nbytes();
      return outputs[0];
    }
    auto h = x;
    for (std::size_t i = 0; i < options_->layers->size(); ++i) {
      h = options_->layers->at(i)->forward(h);
      stashed += h.data().nbytes();
    }
    return h;
  }

  void forward(const actors::tensor_message& work) {
    const context_key key{work.meta.context_id, work.meta.micro_batch, 0};
    // Distributed autograd: the received activation becomes a leaf of this
    // stage's graph; its gradient goes back under the same key.
    auto x = registry_.receive(key, work.value, !first());
    micro_batch_rows_[key] = work.value.rank() > 0 ? work.value.size(0) : 1;
    std::size_t stashed = 0;
    auto output = run_layers(x, stashed);
    stash_bytes_[key] = stashed;
    stashed_ += stashed;
    stats_.peak_stashed_bytes = std::max<std::uint64_t>(stats_.peak_stashed_bytes, stashed_);

    if (!last()) {
      registry_.record_send(key, output);
      send(next_, message_kind::forward_activation, key, output.data());
      return;
    }
    // The last stage: loss against the target, then this micro-batch's
    // backward is ready at once, seeded with its weight b_j / B.
    auto target_it = targets_.find(key);
    TROUPE_ASSERT(target_it != targets_.end(), "stage {}: forward without a target",
                  options_->name);
    auto target = std::move(target_it->second);
    targets_.erase(target_it);
    auto loss = options_->loss(output, target);
    require(loss.numel() == 1, "stage {}: the loss function returned {} values; it must return one",
            options_->name, loss.numel());
    const double weight =
        static_cast<double>(target.size(0)) / static_cast<double>(std::max<std::uint64_t>(batch_, 1));
    registry_.record_send(key, loss);
    if (options_->device.kind == device_kind::cpu)
      caf::anon_send(driver_, loss_atom::value, key.context_id, key.micro_batch, loss.item());
    else // reading it would wait for the device: read the step's losses together, at its end
      unread_losses_.emplace_back(key, loss.data());
    actors::tensor_message seed;
    seed.meta.kind = message_kind::backward_gradient;
    seed.meta.step = work.meta.step;
    seed.meta.micro_batch = key.micro_batch;
    seed.meta.context_id = key.context_id;
    seed.value = tensor::full(loss.shape(), weight, loss.type(), loss.data().where());
    queue_.push(std::move(seed));
  }

  void backward(const actors::tensor_message& work) {
    const context_key key{work.meta.context_id, work.meta.micro_batch, 0};
    rows_done_ += static_cast<std::uint64_t>(micro_batch_rows_[key]);
    const bool last_rows = rows_done_ >= batch_;
    // The step's last samples: their backward pass (or the deferred weight
    // gradients after it) starts the buckets; earlier ones only accumulate.
    if (data_parallel_)
      data_parallel_->set_final_pass(last_rows);
    {
      std::optional<autograd::deferral_scope> deferral;
      if (options_->defer_weight_gradients)
        deferral.emplace(deferred_);
      registry_.backward_sent(key, work.value);
    }
    stats_.peak_deferred_bytes = std::max<std::uint64_t>(stats_.peak_deferred_bytes, deferred_.bytes());
    queue_.finished_backward();
    // The weight gradients of the whole step, once its last backward ran:
    // after the input gradient has gone upstream (the previous stage waits
    // for it; this stage's weights wait only for the optimizer step), then
    // the update.
    auto flush_after = [&] {
      if (!last_rows)
        return;
      report_unread_losses();
      deferred_.flush();
      apply_update();
    };
    if (auto it = stash_bytes_.find(key); it != stash_bytes_.end()) {
      stashed_ -= it->second;
      stash_bytes_.erase(it);
    }
    if (first()) {
      registry_.forget(key);
      caf::anon_send(driver_, micro_batch_done_atom::value, key.context_id, key.micro_batch);
      flush_after();
      return;
    }
    send(previous_, message_kind::backward_gradient, key, registry_.take_received_grad(key));
    flush_after();
  }

  /// The step's optimizer update, once this stage's last backward ran (its
  /// own work only: it needs no other stage, so the stages update side by
  /// side while the driver waits for all of them).
  void apply_update() {
    require(queue_.in_flight() == 0 && registry_.empty(),
            "stage {}: step {} applied with {} micro-batches still in flight", options_->name,
            step_, queue_.in_flight());
    deferred_.flush(); // already empty unless the step's rows were miscounted
    if (data_parallel_)
      if (auto ok = data_parallel_->synchronize(); !ok)
        throw std::runtime_error(fmt::format("stage {}: averaging gradients with its replicas failed: {}",
                                             options_->name, ok.error_value().message()));
    // An asynchronous checkpoint may still be copying the parameters.
    if (checkpoint_writer_)
      checkpoint_writer_->wait_for_copy();
    options_->optimizer->step();
    options_->optimizer->zero_grad();
    caf::anon_send(driver_, applied_atom::value, static_cast<std::uint64_t>(options_->index), step_);
  }

  /// Sends the driver the losses kept on the device (one wait for the
  /// device per step rather than one per micro-batch).
  void report_unread_losses() {
    for (auto& [key, value] : unread_losses_)
      caf::anon_send(driver_, loss_atom::value, key.context_id, key.micro_batch, value.item());
    unread_losses_.clear();
  }

  void evaluate(const actors::tensor_message& work) {
    auto started = clock::now();
    autograd::no_grad_guard no_grad;
    auto output = options_->layers->forward(autograd::variable(work.value));
    const context_key key{0, work.meta.micro_batch, 0};
    if (last()) {
      stage_endpoint driver{options_->stages, driver_place_, driver_};
      send(driver, message_kind::forward_activation, key, output.data());
    } else {
      send(next_, message_kind::forward_activation, key, output.data());
    }
    stats_.busy_ms += std::chrono::duration<double, std::milli>(clock::now() - started).count();
  }

  void send(const stage_endpoint& to, message_kind kind, const context_key& key, tensor value) {
    actors::tensor_message message;
    message.meta.kind = kind;
    message.meta.step = key.context_id;
    message.meta.micro_batch = key.micro_batch;
    message.meta.context_id = key.context_id;
    message.meta.destination = to.where.to_string();
    message.value = std::move(value);
    auto sent = options_->sender(to, std::move(message));
    require(sent.has_value(), "stage {}: sending {} of micro-batch {} to stage {} failed: {}",
            options_->name, name_of(kind), key.micro_batch, to.index,
            sent.has_value() ? std::string{} : sent.error_value().message());
  }

  /// Hybrid: joins the stage's reducer ring and installs its data_parallel
  /// (once, at the first step; blocks this detached stage's thread at most
  /// the ring's timeout).
  void join_ring() {
    const auto& r = options_->replication;
    if (r.ring.empty() || data_parallel_)
      return;
    require(r.node != nullptr, "stage {}: replicated without a node for its reducer", options_->name);
    reducer_group_options o;
    o.rank = r.rank;
    o.places = r.ring;
    o.timeout = r.timeout;
    auto group = reducer_group::join(*r.node, o);
    if (!group)
      throw std::runtime_error(fmt::format("stage {}: joining its replicas' ring failed: {}", options_->name,
                                           group.error_value().message()));
    data_parallel_options dp;
    dp.buckets.bucket_bytes = r.bucket_bytes;
    dp.name = fmt::format("{} (replica {})", options_->name, r.rank);
    auto created = data_parallel::create(options_->layers->named_parameters(), *group, dp);
    if (!created)
      throw std::runtime_error(created.error_value().message());
    data_parallel_.emplace(std::move(*created)); // keeps the group's member

  }

  std::shared_ptr<stage_options> options_;
  /// The stage's checkpoint writes (p_save); its copy of the state must end
  /// before the next optimizer step changes it.
  std::shared_ptr<background_writer> checkpoint_writer_;
  std::optional<data_parallel> data_parallel_;
  autograd::deferred_weight_grads deferred_;
  std::map<context_key, std::int64_t> micro_batch_rows_;
  std::uint64_t rows_done_ = 0; ///< samples whose backward ran this step
  work_queue queue_;
  context_registry registry_;
  stage_endpoint previous_;
  stage_endpoint next_;
  caf::actor driver_;
  actors::place driver_place_;
  std::uint64_t step_ = 0;
  std::uint64_t batch_ = 0;
  std::map<context_key, actors::tensor_message> waiting_for_target_;
  std::map<context_key, tensor> targets_;
  /// The last stage on a device: this step's losses, not yet read.
  std::vector<std::pair<context_key, tensor>> unread_losses_;
  std::map<context_key, std::size_t> stash_bytes_;
  std::size_t stashed_ = 0;
  std::vector<actors::tensor_message> early_;
  trace::name_id trace_name_;
  stage_stats stats_;
  /// Busy and fill time of the steps before this one (stats_ is per step).
  double busy_before_ms_ = 0;
  double fill_before_ms_ = 0;
};

} // namespace

caf::behavior stage_actor(caf::event_based_actor* self, std::shared_ptr<stage_options> options) {
  auto state = std::make_shared<stage_state>(std::move(options));
  auto run_scheduled = std::make_shared<bool>(false);
  // Every handler validates and turns exceptions into a p_failed report: an
  // exception escaping a handler would kill the actor without a word.
  // Messages to the driver are anonymous and the state lets go of every
  // handle when the stage stops: a handle held by a stopped actor's state, or
  // a sender reference in an unread message, would keep actors alive in a
  // cycle and the actor system's shutdown waiting for them.
  self->attach_functor([state] { state->release(); });
  auto report = [state](const std::exception& e) {
    if (state->driver())
      caf::anon_send(state->driver(), stage_failed_atom::value,
                 static_cast<std::uint64_t>(state->options().index), state->step(),
                 std::string{e.what()});
  };
  // The reminder to itself is anonymous too: a run_atom with the stage as
  // its sender, left in the mailbox as the stage stopped, held the stage's
  // last strong reference, and the actor system's shutdown waited for it
  // forever (pipeline_demo --replicas=2, about one run in ten, seen with gdb:
  // the only reference to the stopped stage was such a message's sender).
  auto schedule_run = [self, state, run_scheduled] {
    if (!*run_scheduled && state->has_work()) {
      *run_scheduled = true;
      caf::anon_send(caf::actor_cast<caf::actor>(self), run_atom::value);
    }
  };
  return {
    [=](wire_atom, caf::actor previous, caf::actor next, caf::actor driver,
        const std::string& previous_place, const std::string& next_place,
        const std::string& driver_place) {
      state->wire(std::move(previous), std::move(next), std::move(driver));
      state->set_places(previous_place, next_place, driver_place);
      return caf::make_message(caf::ok_atom::value);
    },
    [=](digest_atom) { return caf::make_message(state->digest()); },
    [=](save_atom, const std::string& root, std::uint64_t step, const std::string& writer,
        const std::string& model_holders, const std::string& step_holders, bool asynchronous, bool sharded,
        const std::string& split_holders) {
      auto saved = save_training_state(*state->options().layers, *state->options().optimizer, state->checkpoint_writer(),
                                       {root, step, writer, split_names(model_holders), split_names(step_holders),
                                        sharded, split_names(split_holders)},
                                       asynchronous);
      return saved ? std::string{} : saved.error().message();
    },
    [=](load_atom, const std::string& directory, bool sharded) {
      auto loaded = load_training_state(*state->options().layers, *state->options().optimizer,
                                        state->checkpoint_writer(), directory, sharded);
      return loaded ? std::string{} : loaded.error().message();
    },
    [=](begin_step_atom, std::uint64_t step, std::uint64_t batch) {
      try {
        state->begin(step, batch);
      } catch (const std::exception& e) {
        report(e);
      }
      schedule_run();
    },
    [=](const actors::tensor_message& message) {
      try {
        state->arrive(message);
      } catch (const std::exception& e) {
        report(e);
      }
      schedule_run();
    },
    [=](run_atom) {
      *run_scheduled = false;
      try {
        state->run_one();
      } catch (const std::exception& e) {
        report(e);
      }
      schedule_run();
    },
    [=](stats_atom) {
      auto s = state->stats();
      return caf::make_message(s.peak_stashed_bytes, s.peak_in_flight, s.busy_ms, s.peak_deferred_bytes, s.fill_ms,
                               s.total_busy_ms, s.total_fill_ms);
    },
  };
}

} // namespace troupe::parallel
