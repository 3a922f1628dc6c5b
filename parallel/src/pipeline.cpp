// The pipeline's driver: spawns and wires the stages, feeds micro-batches,
// collects losses and completions, and turns every failure into an error.
#include "pipeline_state.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <optional>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "training_state.hpp"

#include "troupe/actors/node.hpp"
#include "troupe/job.hpp"
#include "troupe/actors/peer_monitor.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/parallel/remote.hpp"

namespace troupe::parallel {

optimizer_factory sgd_factory(optim::sgd_options options) {
  return [options](optim::named_variables parameters) -> std::unique_ptr<optim::optimizer> {
    return std::make_unique<optim::sgd>(std::move(parameters), options);
  };
}

namespace {
/// adam's AdamW constructor is protected; this exposes it.
class adamw_optimizer final : public optim::adam {
public:
  adamw_optimizer(optim::named_variables parameters, const optim::adam_options& options)
      : optim::adam(std::move(parameters), options, true) {}
};
} // namespace

optimizer_factory adam_factory(optim::adam_options options, bool decoupled) {
  return [options, decoupled](optim::named_variables parameters) -> std::unique_ptr<optim::optimizer> {
    if (decoupled)
      return std::make_unique<adamw_optimizer>(std::move(parameters), options);
    return std::make_unique<optim::adam>(std::move(parameters), options);
  };
}

loss_function mse_loss_function() {
  return [](const autograd::variable& output, const tensor& target) {
    return autograd::mse_loss(output, autograd::variable(target));
  };
}

loss_function cross_entropy_loss_function() {
  return [](const autograd::variable& output, const tensor& target) {
    return autograd::cross_entropy(output, target);
  };
}

/// The blocking actor through which the calling thread talks to the stages.
struct pipeline::state::driver {
  explicit driver(caf::actor_system& system) : self(system) {}
  caf::actor handle() const { return caf::actor_cast<caf::actor>(self.ptr()); }
  caf::scoped_actor self;
};

pipeline::state::state(actors::node& node, pipeline_options options) : node_(node), options_(std::move(options)) {}

pipeline::state::~state() {
  finish_hook_.forget();
  shutdown();
}

pipeline::pipeline(std::unique_ptr<state> st) : state_(std::move(st)) {}
pipeline::~pipeline() = default;
pipeline::pipeline(pipeline&&) noexcept = default;
pipeline& pipeline::operator=(pipeline&&) noexcept = default;

expected<double> pipeline::train_step(const tensor& inputs, const tensor& targets) {
  return state_->train_step(inputs, targets);
}
expected<tensor> pipeline::forward(const tensor& inputs) { return state_->forward(inputs); }
expected<void> pipeline::synchronize() { return state_->synchronize(); }
expected<std::vector<stage_stats>> pipeline::stats() { return state_->stats(); }
expected<std::vector<double>> pipeline::parameter_digests() { return state_->parameter_digests(); }
std::size_t pipeline::stages() const noexcept { return state_->stages_.size(); }
const partition& pipeline::split() const noexcept { return state_->options_.split; }
const std::string& pipeline::stage_name(std::size_t index) const { return state_->names_.at(index); }
std::uint64_t pipeline::steps() const noexcept { return state_->step_; }

std::vector<double> per_micro_batch_ms(const std::vector<stage_stats>& stats, std::size_t micro_batches) {
  require(micro_batches > 0, "per_micro_batch_ms: micro_batches must be positive");
  std::vector<double> out;
  for (const auto& s : stats)
    out.push_back(s.busy_ms / static_cast<double>(micro_batches));
  return out;
}

void pipeline::state::stop_with(troupe::job& job) {
  finish_hook_ = finish_hook(job, [this] { shutdown(); });
}

void pipeline::state::shutdown() {
  if (shut_down_)
    return;
  shut_down_ = true;
  // With overlap_update the stages may still be updating the model, which
  // in one process the caller keeps: let them finish first.
  if (driver_ && !broken_)
    (void)synchronize();
  // Stages are detached actors: each stops when it sees the exit message.
  for (auto& stage : stages_)
    caf::anon_send_exit(stage, caf::exit_reason::user_shutdown);
  if (!options_.in_this_process) {
    if (peer_lost_handler_)
      node_.remove_peer_lost_handler(peer_lost_handler_);
    // Free the names for the next pipeline (errors: the node is gone anyway).
    for (std::size_t i = 0; i < stages_.size(); ++i)
      (void)node_.unregister_actor(places_[i]);
    if (!driver_place_.name.empty())
      (void)node_.unregister_actor(driver_place_);
  }
  // The driver's scoped actor counts as a live actor of the system: a job
  // finishing with this pipeline still in scope would wait for it.
  stages_.clear();
  driver_.reset();
}

void pipeline::state::validate(pipeline_options& options) {
  require(options.model != nullptr && options.model->size() > 0,
          "pipeline: no model (or a model without layers)");
  require(!options.places.empty(), "pipeline: no places; give one place per stage");
  if (options.split.boundaries.empty()) {
    require(options.places.size() <= options.model->size(),
            "pipeline: {} places for a model of {} layers; every stage needs a layer",
            options.places.size(), options.model->size());
    options.split = even(options.places.size(), options.model->size());
  }
  require(options.split.stages() == options.places.size(),
          "pipeline: {} places for a partition of {} stages; give one place per stage",
          options.places.size(), options.split.stages());
  require(options.split.layers() == options.model->size() && options.split.begin(0) == 0,
          "pipeline: the partition covers layers [0, {}) but the model has {}",
          options.split.layers(), options.model->size());
  for (std::size_t s = 0; s < options.split.stages(); ++s)
    require(options.split.begin(s) < options.split.end(s),
            "pipeline: stage {} of the partition has no layers", s);
  require(options.micro_batches >= 1, "pipeline: {} micro-batches; need at least one",
          options.micro_batches);
  if (!options.micro_batch_shares.empty())
    check_micro_batch_shares(options.micro_batches, options.micro_batch_shares);
  require(static_cast<bool>(options.optimizer), "pipeline: no optimizer factory");
  require(static_cast<bool>(options.loss), "pipeline: no loss function");
  require(options.timeout.count() > 0, "pipeline: the timeout must be positive");
  if (options.replication) {
    const auto& r = *options.replication;
    require(r.places.size() >= 2 && r.index < r.places.size(),
            "pipeline: replica {} of {} replicas; need at least two and index < replicas", r.index,
            r.places.size());
    for (std::size_t k = 0; k < r.places.size(); ++k)
      require(r.places[k].size() == options.places.size(),
              "pipeline: replica {} has {} stage places but the pipeline has {} stages", k, r.places[k].size(),
              options.places.size());
    require(r.places[r.index] == options.places,
            "pipeline: replica {}'s row of replication.places differs from places", r.index);
    require(r.bucket_bytes > 0, "pipeline: replication.bucket_bytes must be positive");
  }
}

expected<std::unique_ptr<pipeline::state>> pipeline::state::started(actors::node& node, pipeline_options options,
                                                                    std::string stage_factory,
                                                                    nn::deferred_init* pending_values) {
  validate(options);
  auto st = std::make_unique<state>(node, std::move(options));
  st->stage_factory_ = std::move(stage_factory);
  if (auto ok = st->start(pending_values); !ok)
    return ok.error_value();
  return st;
}

expected<pipeline> pipeline::create(actors::node& node, pipeline_options options) {
  auto st = state::started(node, std::move(options));
  if (!st)
    return st.error_value();
  return pipeline(std::move(*st));
}

std::vector<std::vector<std::string>> pipeline::state::replica_rings() const {
  std::vector<std::vector<std::string>> rings(options_.split.stages());
  if (!options_.replication)
    return rings;
  const auto& r = *options_.replication;
  for (std::size_t k = 0; k < r.places.size(); ++k)
    for (std::size_t s = 0; s < rings.size(); ++s) {
      auto where = actors::place::parse(r.places[k][s]);
      require(where.has_value(), "pipeline: replica {}'s place {} of stage {}: {}", k, r.places[k][s], s,
              where.has_value() ? std::string{} : where.error_value().message());
      rings[s].push_back(
        where->with_name(fmt::format("{}{}r{}.stage{}.reducer", r.tag, r.tag.empty() ? "" : ".", k, s)).to_string());
    }
  return rings;
}

expected<void> pipeline::state::start(nn::deferred_init* pending_values) {
  driver_ = std::make_unique<driver>(node_.system());
  const auto p = options_.split.stages();
  for (std::size_t i = 0; i < p; ++i) {
    auto where = actors::place::parse(options_.places[i]);
    require(where.has_value(), "pipeline: place {} of stage {}: {}", options_.places[i], i,
            where.has_value() ? std::string{} : where.error_value().message());
    places_.push_back(where->with_name(options_.name.empty() ? fmt::format("stage{}", i)
                                                             : fmt::format("{}.stage{}", options_.name, i)));
    names_.push_back(places_.back().to_string());
    stage_traces_.push_back(trace::intern(names_.back()));
  }
  if (!options_.in_this_process) {
    // The driver receives evaluation outputs through the router: give it a
    // place on this node. One name per pipeline in this process.
    static std::atomic<std::uint64_t> next_driver{0};
    driver_place_ = actors::place{node_.name(), device::cpu(),
                                  fmt::format("pipeline-driver{}", next_driver++)};
    if (auto ok = node_.register_actor(driver_place_, driver_->handle()); !ok)
      return ok.error_value();
    driver_trace_ = trace::intern(driver_place_.to_string());
    sender_ = routed_tensor_sender(node_.router(), driver_place_.to_string());
    // A lost node reaches the driver as a message, so train_step sees it
    // while it waits (the handler runs on the node's agent thread).
    peer_lost_handler_ = node_.on_peer_lost([driver = driver_->handle()](const actors::peer_lost& lost) {
      caf::anon_send(driver, peer_lost_atom::value, lost.node, lost.reason);
    });
  } else {
    driver_trace_ = trace::intern("driver");
  }
  const auto rings = replica_rings();
  for (std::size_t i = 0; i < p; ++i) {
    auto policy = policy_for(options_.schedule, i, p, options_.micro_batches);
    policy.fixed_order = options_.fixed_order;
    const bool remat = options_.remat == rematerialization::always ||
                       (options_.remat == rematerialization::all_but_last_stage && i + 1 < p);
    if (!options_.in_this_process) {
      stage_spec spec;
      spec.index = i;
      spec.stages = p;
      spec.begin = options_.split.begin(i);
      spec.end = options_.split.end(i);
      spec.credits = policy.credits;
      spec.backward_first = policy.backward_first;
      spec.fixed_order = policy.fixed_order;
      spec.micro_batches = policy.micro_batches;
      spec.rematerialize = remat;
      spec.defer_weight_gradients = options_.defer_weight_gradients;
      spec.fill_idle_with_weight_gradients = options_.fill_idle_with_weight_gradients;
      if (options_.replication) {
        spec.replica_rank = options_.replication->index;
        for (const auto& member : rings[i])
          spec.ring += (spec.ring.empty() ? "" : ",") + member;
        spec.bucket_bytes = options_.replication->bucket_bytes;
        spec.ring_timeout_ms = static_cast<std::uint64_t>(options_.timeout.count());
      }
      auto spawned = node_.spawn_remote(places_[i], stage_factory_, to_message(spec));
      if (!spawned)
        return make_error(spawned.error_value().code(), "pipeline: stage {} ({}) could not start: {}",
                          i, names_[i], spawned.error_value().message());
      stages_.push_back(*spawned);
    } else {
      auto stage = std::make_shared<stage_options>();
      stage->index = i;
      stage->stages = p;
      stage->layers = options_.model->slice(options_.split.begin(i), options_.split.end(i));
      if (pending_values) // a model built from a recipe for its stages
        pending_values->materialize(*stage->layers);
      // The slice shares the model's modules: after this, `model` holds
      // each stage's layers on that stage's device.
      stage->device = places_[i].device;
      stage->layers->to(stage->device);
      stage->optimizer = options_.optimizer(stage->layers->named_parameters());
      stage->loss = options_.loss;
      stage->rematerialize = remat;
      stage->defer_weight_gradients = options_.defer_weight_gradients;
      stage->fill_idle_with_weight_gradients = options_.fill_idle_with_weight_gradients;
      stage->policy = policy;
      stage->sender = local_tensor_sender(names_[i]);
      stage->name = names_[i];
      if (options_.replication) {
        stage->replication.rank = options_.replication->index;
        stage->replication.ring = rings[i];
        stage->replication.node = &node_;
        stage->replication.bucket_bytes = options_.replication->bucket_bytes;
        stage->replication.timeout = options_.timeout;
      }
      stages_.push_back(node_.system().spawn<caf::detached>(::troupe::parallel::stage_actor, std::move(stage)));
    }
    driver_->self->monitor(stages_.back());
  }
  // Wire every stage to its neighbours and wait for all acknowledgements, so
  // no tensor can reach a stage that does not know where to send its result.
  for (std::size_t i = 0; i < p; ++i) {
    caf::actor previous = i > 0 ? stages_[i - 1] : caf::actor{};
    caf::actor next = i + 1 < p ? stages_[i + 1] : caf::actor{};
    std::string previous_place = i > 0 ? names_[i - 1] : std::string{};
    std::string next_place = i + 1 < p ? names_[i + 1] : std::string{};
    std::optional<troupe::error> failed;
    driver_->self->request(stages_[i], options_.timeout, wire_atom::value, previous, next,
                           driver_->handle(), previous_place, next_place,
                           driver_place_.name.empty() ? std::string{} : driver_place_.to_string())
      .receive([](caf::ok_atom) {},
               [&](caf::error& err) {
                 failed = make_error(errc::io_error, "pipeline: stage {} ({}) did not start: {}",
                                     i, names_[i], node_.system().render(err));
               });
    if (failed)
      return *failed;
  }
  return {};
}

expected<void> pipeline::state::send_to_stage(std::size_t index, actors::tensor_message message) {
  if (!options_.in_this_process) // the router records the send
    return sender_(stage_endpoint{index, places_[index], stages_[index]}, std::move(message));
  if (trace::enabled()) {
    message.flow_id = trace::next_flow_id();
    trace::message_sent(driver_trace_,
                        trace::message_info(actors::trace_kind(message.meta.kind), stage_traces_[index],
                                            message.value.nbytes(), message.flow_id,
                                            static_cast<std::uint32_t>(message.meta.step),
                                            message.meta.micro_batch));
  }
  driver_->self->send(stages_[index], std::move(message));
  return {};
}

expected<void> pipeline::state::fail(troupe::error err) {
  broken_ = err;
  return err;
}

void check_micro_batch_shares(std::size_t micro_batches, const std::vector<double>& shares) {
  require(shares.size() == micro_batches, "pipeline: {} micro-batch shares for {} micro-batches; give one each",
          shares.size(), micro_batches);
  for (std::size_t j = 0; j < shares.size(); ++j)
    require(std::isfinite(shares[j]) && shares[j] > 0, "pipeline: micro-batch share {} is {}; shares must be "
            "positive", j, shares[j]);
}

std::vector<std::int64_t> micro_batch_rows(std::int64_t batch, std::size_t micro_batches,
                                           const std::vector<double>& shares) {
  const auto m = static_cast<std::int64_t>(micro_batches);
  require(m >= 1 && batch >= m, "pipeline: {} micro-batches for a batch of {}; every micro-batch needs a sample",
          m, batch);
  std::vector<std::int64_t> rows(micro_batches);
  if (shares.empty()) {
    for (std::int64_t j = 0; j < m; ++j)
      rows[j] = batch / m + (j < batch % m ? 1 : 0);
    return rows;
  }
  check_micro_batch_shares(micro_batches, shares);
  const double total = std::accumulate(shares.begin(), shares.end(), 0.0);
  // Largest remainders: floor every exact part, then one more row to the
  // parts that lost most (the earlier one on a tie).
  std::vector<std::pair<double, std::size_t>> lost;
  std::int64_t given = 0;
  for (std::size_t j = 0; j < shares.size(); ++j) {
    const double exact = static_cast<double>(batch) * shares[j] / total;
    rows[j] = static_cast<std::int64_t>(std::floor(exact));
    given += rows[j];
    lost.emplace_back(exact - static_cast<double>(rows[j]), j);
  }
  std::stable_sort(lost.begin(), lost.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; given < batch; ++k, ++given)
    ++rows[lost[k % lost.size()].second];
  for (std::size_t j = 0; j < rows.size(); ++j)
    require(rows[j] >= 1, "pipeline: micro-batch {} gets no rows of a batch of {} with shares {}", j, batch,
            fmt::join(shares, ", "));
  return rows;
}

expected<double> pipeline::state::train_step(const tensor& inputs, const tensor& targets) {
  require(inputs.defined() && targets.defined() && inputs.rank() >= 1 && targets.rank() >= 1,
          "pipeline::train_step: inputs and targets need a batch dimension");
  const auto batch = inputs.size(0);
  require(targets.size(0) == batch,
          "pipeline::train_step: {} inputs but {} targets; the batch sizes must match", batch,
          targets.size(0));
  const auto m = static_cast<std::int64_t>(options_.micro_batches);
  require(batch >= m,
          "pipeline::train_step: {} micro-batches for a batch of {}; every micro-batch needs a "
          "sample",
          m, batch);
  if (shut_down_)
    return make_error(errc::invalid_argument, "pipeline: its job has finished; the stages are stopped");
  if (broken_)
    return make_error(broken_->code(), "pipeline: an earlier step failed: {}", broken_->message());

  const auto sizes = micro_batch_rows(batch, options_.micro_batches, options_.micro_batch_shares);
  const std::uint64_t step = ++step_;
  const auto last = stages_.size() - 1;
  for (auto& stage : stages_)
    driver_->self->send(stage, begin_step_atom::value, step, static_cast<std::uint64_t>(batch));
  // Targets first, so the last stage never waits long for one; then every
  // micro-batch to the first stage, whose credits decide when each runs.
  std::int64_t offset = 0;
  for (std::int64_t j = 0; j < m; ++j) {
    const auto size = sizes[j];
    actors::tensor_message target;
    target.meta.kind = message_kind::control;
    target.meta.step = step;
    target.meta.micro_batch = static_cast<std::uint32_t>(j);
    target.meta.context_id = step;
    target.meta.destination = names_[last];
    target.value = targets.narrow(0, offset, size).contiguous();
    if (auto sent = send_to_stage(last, std::move(target)); !sent)
      return fail(make_error(sent.error_value().code(), "pipeline: sending targets to stage {} ({}) failed: {}",
                             last, names_[last], sent.error_value().message())).error_value();
    offset += size;
  }
  offset = 0;
  for (std::int64_t j = 0; j < m; ++j) {
    actors::tensor_message input;
    input.meta.kind = message_kind::forward_activation;
    input.meta.step = step;
    input.meta.micro_batch = static_cast<std::uint32_t>(j);
    input.meta.context_id = step;
    input.meta.destination = names_[0];
    input.value = inputs.narrow(0, offset, sizes[j]).contiguous();
    if (auto sent = send_to_stage(0, std::move(input)); !sent)
      return fail(make_error(sent.error_value().code(), "pipeline: sending inputs to stage 0 ({}) failed: {}",
                             names_[0], sent.error_value().message())).error_value();
    offset += sizes[j];
  }

  std::vector<double> losses(static_cast<std::size_t>(m), 0.0);
  if (auto done = await_step(step, losses); !done)
    return done.error_value();
  // The batch's mean loss: micro-batch means weighted by their share.
  double loss = 0;
  for (std::int64_t j = 0; j < m; ++j)
    loss += losses[j] * static_cast<double>(sizes[j]) / static_cast<double>(batch);
  return loss;
}

expected<void> pipeline::state::await_step(std::uint64_t step, std::vector<double>& losses) {
  const std::size_t m = losses.size();
  const std::size_t p = stages_.size();
  std::size_t losses_seen = 0;
  std::size_t backwards_done = 0;
  std::size_t applied = 0;
  std::optional<troupe::error> failed;
  auto stage_of = [this](const caf::actor_addr& source) -> std::size_t {
    for (std::size_t i = 0; i < stages_.size(); ++i)
      if (stages_[i].address() == source)
        return i;
    return stages_.size();
  };
  auto phase = [&] {
    auto updating = updating_step_ == 0 ? std::string{}
                                        : fmt::format("step {}: {} of {} stages updated", updating_step_,
                                                      updates_seen_, p);
    if (step == 0)
      return updating.empty() ? std::string{"no step"} : updating;
    return fmt::format("step {} ({} of {} losses, {} of {} backwards, {} of {} stages updated{}{})", step,
                       losses_seen, m, backwards_done, m, applied, p, updating.empty() ? "" : "; ", updating);
  };
  // Each stage takes its optimizer step by itself after its last backward.
  // With overlap_update the step is complete without them (they finish in
  // the background); the previous step's must all be in.
  const bool wait_for_updates = step != 0 && !options_.overlap_update;
  auto complete = [&] {
    return losses_seen >= m && backwards_done >= m && (!wait_for_updates || applied >= p) &&
           (updating_step_ == 0 || updates_seen_ >= p);
  };
  // Receives until the step is complete or fails; each wait is bounded.
  while (!failed && !complete()) {
    driver_->self->receive(
      [&](loss_atom, std::uint64_t s, std::uint32_t mb, double value) {
        if (s == step && mb < m) {
          losses[mb] = value;
          ++losses_seen;
        }
      },
      [&](micro_batch_done_atom, std::uint64_t s, std::uint32_t) {
        if (s == step)
          ++backwards_done;
      },
      [&](applied_atom, std::uint64_t, std::uint64_t s) {
        if (step != 0 && s == step)
          ++applied;
        else if (s == updating_step_)
          ++updates_seen_;
      },
      [&](stage_failed_atom, std::uint64_t stage, std::uint64_t, std::string& what) {
        failed = make_error(errc::invalid_argument, "pipeline: stage {} ({}) failed in {}: {}",
                            stage, stage < names_.size() ? names_[stage] : "?", phase(), what);
      },
      [&](caf::down_msg& down) {
        auto i = stage_of(down.source);
        failed = make_error(errc::io_error, "pipeline: stage {} ({}) stopped during {}: {}", i,
                            i < names_.size() ? names_[i] : "?", phase(),
                            node_.system().render(down.reason));
      },
      [&](peer_lost_atom, std::string& node, std::string& reason) {
        for (std::size_t i = 0; i < p && !failed; ++i)
          if (places_[i].node == node)
            failed = make_error(errc::io_error, "pipeline: stage {} ({}) lost during {}: node {} was lost: {}",
                                i, names_[i], phase(), node, reason);
        if (!failed && linked(node))
          failed = make_error(errc::io_error,
                              "pipeline: lost during {}: node {}, whose stages this step's stages meet in "
                              "collectives, was lost: {}",
                              phase(), node, reason);
      },
      [&](const actors::tensor_message&) {
        // A late evaluation output: not part of this step.
      },
      caf::after(options_.timeout) >> [&] {
        // Name the stage the step is waiting on: a missing loss points at
        // the last stage, missing backwards at the first.
        std::string waiting =
          losses_seen < m ? fmt::format("stage {} ({}) has not reported every loss", p - 1, names_[p - 1])
          : backwards_done < m ? fmt::format("stage 0 ({}) has not finished every backward", names_[0])
                               : std::string{"not every stage applied its update"};
        failed = make_error(errc::io_error, "pipeline: no progress for {} ms in {}: {}",
                            options_.timeout.count(), phase(), waiting);
      });
  }
  if (failed)
    return fail(*failed);
  if (updates_seen_ >= p)
    updating_step_ = 0;
  if (step != 0 && applied < p) {
    // overlap_update: the rest arrives during the next call.
    updating_step_ = step;
    updates_seen_ = applied;
  }
  return {};
}

expected<void> pipeline::state::synchronize() {
  if (broken_)
    return make_error(broken_->code(), "pipeline: an earlier step failed: {}", broken_->message());
  if (updating_step_ == 0)
    return {};
  std::vector<double> none;
  return await_step(0, none);
}

expected<void> pipeline::state::ready_for_query() {
  if (shut_down_)
    return make_error(errc::invalid_argument, "pipeline: its job has finished; the stages are stopped");
  // After an earlier failure the query reports whatever the stages hold, as
  // before that failure was known; otherwise the last step's updates first.
  const bool was_broken = broken_.has_value();
  if (auto ready = synchronize(); !ready && !was_broken)
    return ready;
  return {};
}

expected<tensor> pipeline::state::forward(const tensor& inputs) {
  require(inputs.defined() && inputs.rank() >= 1,
          "pipeline::forward: inputs need a batch dimension");
  if (shut_down_)
    return make_error(errc::invalid_argument, "pipeline: its job has finished; the stages are stopped");
  const auto batch = inputs.size(0);
  const auto m = std::min<std::int64_t>(static_cast<std::int64_t>(options_.micro_batches), batch);
  // Results and failures of the last step's updates first, not mistaken
  // for the evaluation's.
  if (auto ready = synchronize(); !ready)
    return ready.error_value();
  std::int64_t offset = 0;
  for (std::int64_t j = 0; j < m; ++j) {
    const auto size = batch / m + (j < batch % m ? 1 : 0);
    actors::tensor_message input;
    input.meta.kind = message_kind::forward_activation;
    input.meta.micro_batch = static_cast<std::uint32_t>(j);
    input.meta.context_id = 0; // evaluation: no graph, no stash
    input.meta.destination = names_[0];
    input.value = inputs.narrow(0, offset, size).contiguous();
    if (auto sent = send_to_stage(0, std::move(input)); !sent)
      return make_error(sent.error_value().code(), "pipeline: sending inputs to stage 0 ({}) failed: {}",
                        names_[0], sent.error_value().message());
    offset += size;
  }
  std::vector<tensor> outputs(static_cast<std::size_t>(m));
  std::int64_t received = 0;
  std::optional<troupe::error> failed;
  while (!failed && received < m) {
    driver_->self->receive(
      [&](const actors::tensor_message& out) {
        if (out.meta.context_id == 0 && out.meta.micro_batch < outputs.size() &&
            !outputs[out.meta.micro_batch].defined()) {
          outputs[out.meta.micro_batch] = out.value;
          ++received;
        }
      },
      [&](stage_failed_atom, std::uint64_t stage, std::uint64_t, std::string& what) {
        failed = make_error(errc::invalid_argument, "pipeline: stage {} ({}) failed in forward: {}",
                            stage, stage < names_.size() ? names_[stage] : "?", what);
      },
      [&](caf::down_msg& down) {
        std::size_t i = 0;
        while (i < stages_.size() && stages_[i].address() != down.source)
          ++i;
        failed = make_error(errc::io_error, "pipeline: stage {} ({}) stopped during forward: {}",
                            i, i < names_.size() ? names_[i] : "?", node_.system().render(down.reason));
      },
      [&](peer_lost_atom, std::string& node, std::string& reason) {
        for (std::size_t i = 0; i < stages_.size() && !failed; ++i)
          if (places_[i].node == node)
            failed = make_error(errc::io_error, "pipeline: stage {} ({}) lost during forward: node {} was lost: {}",
                                i, names_[i], node, reason);
        if (!failed && linked(node))
          failed = make_error(errc::io_error,
                              "pipeline: lost during forward: node {}, whose stages this step's stages meet in "
                              "collectives, was lost: {}",
                              node, reason);
      },
      caf::after(options_.timeout) >> [&] {
        failed = make_error(errc::io_error,
                            "pipeline: no progress for {} ms in forward ({} of {} outputs)",
                            options_.timeout.count(), received, m);
      });
  }
  if (failed) {
    broken_ = *failed;
    return *failed;
  }
  return cat(outputs, 0);
}

bool pipeline::state::linked(const std::string& node) const {
  return std::find(linked_nodes_.begin(), linked_nodes_.end(), node) != linked_nodes_.end();
}

expected<std::vector<stage_stats>> pipeline::state::stats() {
  if (auto ready = ready_for_query(); !ready)
    return ready.error_value();
  std::vector<stage_stats> out(stages_.size());
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    std::optional<troupe::error> failed;
    driver_->self->request(stages_[i], options_.timeout, stats_atom::value)
      .receive(
        [&](std::uint64_t bytes, std::uint64_t in_flight, double busy_ms, std::uint64_t deferred,
            double fill_ms, double total_busy_ms, double total_fill_ms) {
          out[i] = {bytes, deferred, in_flight, busy_ms, fill_ms, total_busy_ms, total_fill_ms};
        },
        [&](caf::error& err) {
          failed = make_error(errc::io_error, "pipeline: stage {} ({}) did not report: {}", i,
                              names_[i], node_.system().render(err));
        });
    if (failed)
      return *failed;
  }
  return out;
}

expected<std::vector<double>> pipeline::state::parameter_digests() {
  if (auto ready = ready_for_query(); !ready)
    return ready.error_value();
  std::vector<double> out(stages_.size());
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    std::optional<troupe::error> failed;
    driver_->self->request(stages_[i], options_.timeout, digest_atom::value)
      .receive([&](double digest) { out[i] = digest; },
               [&](caf::error& err) {
                 failed = make_error(errc::io_error, "pipeline: stage {} ({}) did not report: {}", i,
                                     names_[i], node_.system().render(err));
               });
    if (failed)
      return *failed;
  }
  return out;
}

} // namespace troupe::parallel

namespace troupe::parallel {

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names)
    out += (out.empty() ? "" : ",") + name;
  return out;
}

} // namespace

std::vector<std::string> pipeline::state::checkpoint_writers() const {
  std::vector<std::string> out;
  for (const auto& name : names_)
    out.push_back(writer_name(name));
  return out;
}

expected<void> pipeline::state::ask_every_stage(std::string_view verb, errc refused,
                                                const std::function<caf::message(std::size_t)>& request) {
  if (auto ready = ready_for_query(); !ready)
    return ready;
  // Every request first, then every reply: the stages work in parallel.
  std::vector<caf::response_handle<caf::blocking_actor, caf::message, true>> replies;
  for (std::size_t i = 0; i < stages_.size(); ++i)
    replies.push_back(driver_->self->request(stages_[i], options_.timeout, request(i)));
  std::optional<troupe::error> failed;
  for (std::size_t i = 0; i < stages_.size(); ++i)
    replies[i].receive(
      [&](const std::string& why) {
        if (!failed && !why.empty())
          failed = make_error(refused, "pipeline: stage {} ({}) could not {}: {}", i, names_[i], verb, why);
      },
      [&](caf::error& err) {
        if (!failed)
          failed = make_error(errc::io_error, "pipeline: stage {} ({}) did not {}: {}", i, names_[i], verb,
                              node_.system().render(err));
      });
  if (failed)
    return *failed;
  return {};
}

expected<void> pipeline::state::save_stages(const std::filesystem::path& root, std::uint64_t step,
                                            const std::vector<std::vector<std::string>>& state_holders,
                                            const std::vector<std::string>& step_holders, bool asynchronous,
                                            bool sharded, const std::vector<std::vector<std::string>>& split_holders) {
  const auto writers = checkpoint_writers();
  const auto steps = joined(step_holders);
  return ask_every_stage("save", errc::io_error, [&](std::size_t i) {
    return caf::make_message(save_atom::value, root.string(), step, writers[i], joined(state_holders.at(i)), steps,
                             asynchronous, sharded, sharded ? joined(split_holders.at(i)) : std::string{});
  });
}

expected<void> pipeline::state::load_stages(const std::filesystem::path& directory, bool sharded) {
  auto loaded = ask_every_stage("load", errc::state_mismatch, [&](std::size_t) {
    return caf::make_message(load_atom::value, directory.string(), sharded);
  });
  // Some stages may have loaded and others not: the model is no longer one
  // state, so the pipeline refuses further steps.
  if (!loaded)
    return fail(loaded.error());
  return {};
}

} // namespace troupe::parallel
