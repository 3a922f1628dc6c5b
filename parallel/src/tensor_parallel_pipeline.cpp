// Tensor x pipeline (x data) parallelism (tensor_parallel_pipeline.hpp).
#include "troupe/parallel/tensor_parallel_pipeline.hpp"

#include <optional>
#include <thread>

#include <fmt/format.h>

#include <caf/all.hpp>

#include "concurrent_pipelines.hpp"
#include "kept_layers.hpp"
#include "pipeline_state.hpp"
#include "tensor_parallel_pipeline_access.hpp"
#include "troupe/actors/error_category.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/job.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

struct tensor_parallel_pipeline::state {
  std::optional<mesh> layout;
  std::uint32_t data = 1, tensor = 1;
  /// Every rank's tensor-parallel group, by mesh rank: the layers keep
  /// handles of their own, these only outlive the joins.
  std::vector<std::optional<reducer_group>> groups;
  /// By d T + t.
  std::vector<std::shared_ptr<nn::sequential>> models;
  /// Across processes: this rank's stage, built over its group before the
  /// driver asks for it (tensor_parallel_stage_factory).
  std::shared_ptr<struct prepared_stage> prepared;
  /// Across processes: every rank of the job, joined once its stage is
  /// prepared, so the driver spawns no stage before its process is ready.
  std::optional<reducer_group> ready;
  /// Across processes: releases the groups at job.finish() (the
  /// pipelines' own hooks, newer, stop them first).
  finish_hook release;
  /// By d T + t (only on the driver across processes); declared last, so
  /// stopped before the rest goes.
  std::vector<pipeline> pipelines;
};

/// What a rank hosts of a tensor_parallel_pipeline across processes: stage
/// p of pipeline "d<d>.t<t>", cut from the whole model built over the
/// rank's own tensor-parallel group.
struct prepared_stage {
  std::string name; ///< the stage's place name, "d0.t1.stage1"
  std::size_t begin = 0, end = 0;
  std::shared_ptr<nn::sequential> layers;
  optimizer_factory optimizer;
  loss_function loss; ///< the last stage's only
};

namespace {

void validate(const tensor_parallel_pipeline_options& o) {
  require(o.tensor >= 1 && o.data >= 1, "tensor_parallel_pipeline: {} tensor ranks and {} replicas; need at least one",
          o.tensor, o.data);
  require(static_cast<bool>(o.model) && static_cast<bool>(o.loss),
          "tensor_parallel_pipeline: give a model factory and a loss factory");
  require(!o.pipeline.model && !o.pipeline.loss && o.pipeline.name.empty() && !o.pipeline.replication,
          "tensor_parallel_pipeline: leave the pipeline's model, loss, name and replication unset (they come from "
          "the tensor-parallel options)");
}

/// The node factory through which a driver starts the stage that this
/// process prepared; the spec (from another process) must ask for exactly it.
constexpr const char* tensor_parallel_stage_factory = "troupe.tensor_parallel_stage";

void register_prepared_stage(actors::node& node, const std::shared_ptr<prepared_stage>& prepared) {
  // Weak: a factory is never unregistered, and must not keep the layers.
  std::weak_ptr<prepared_stage> weak = prepared;
  auto* owner = &node;
  node.register_factory(
    tensor_parallel_stage_factory,
    [weak, owner](caf::actor_system& system, const actors::place& where,
                  const caf::message& args) -> caf::expected<caf::actor> {
      auto spec = stage_spec_from(args);
      if (!spec)
        return actors::to_caf_error(spec.error_value());
      auto stage = weak.lock();
      if (!stage)
        return actors::make_caf_error(errc::invalid_argument,
                                      fmt::format("tensor-parallel stage {}: this process holds none (any more)",
                                                  where.to_string()));
      if (where.name != stage->name || spec->begin != stage->begin || spec->end != stage->end)
        return actors::make_caf_error(
          errc::invalid_argument,
          fmt::format("tensor-parallel stage {} with layers [{}, {}) was asked for, but this process prepared {} "
                      "with layers [{}, {})",
                      where.to_string(), spec->begin, spec->end, stage->name, stage->begin, stage->end));
      try {
        return system.spawn<caf::detached>(
          stage_actor, stage_from_spec(*spec, where, *owner, stage->layers, stage->optimizer, stage->loss));
      } catch (const std::exception& e) {
        return actors::make_caf_error(errc::invalid_argument,
                                      fmt::format("tensor-parallel stage {}: {}", where.to_string(), e.what()));
      }
    });
}

/// The partition of `whole` into `stages`: the options' split, or an even one.
partition split_for(const tensor_parallel_pipeline_options& options, std::uint32_t stages,
                    const nn::sequential& whole) {
  auto split = options.pipeline.split;
  if (split.boundaries.empty()) {
    require(stages <= whole.size(), "tensor_parallel_pipeline: {} stages for a model of {} layers", stages,
            whole.size());
    split = even(stages, whole.size());
  }
  require(split.stages() == stages, "tensor_parallel_pipeline: a partition of {} stages for {} pipeline stages",
          split.stages(), stages);
  require(split.layers() == whole.size(), "tensor_parallel_pipeline: the partition covers {} layers but the "
          "model has {}", split.layers(), whole.size());
  return split;
}

} // namespace

expected<tensor_parallel_pipeline> tensor_parallel_pipeline::create(actors::node& node,
                                                                    tensor_parallel_pipeline_options options) {
  validate(options);
  require(options.pipeline.in_this_process, "tensor_parallel_pipeline: on a node of the program's own every stage "
          "runs in this process; set in_this_process, or create it from the job on every rank");
  require(!options.pipeline.places.empty(), "tensor_parallel_pipeline: no places; give one place per stage");
  auto st = std::make_unique<state>();
  st->data = options.data;
  st->tensor = options.tensor;
  const auto stages = static_cast<std::uint32_t>(options.pipeline.places.size());
  const auto T = options.tensor, D = options.data;
  // Rank (d P + p) T + t sits at stage p's place.
  std::vector<std::string> places;
  for (std::uint32_t d = 0; d < D; ++d)
    for (std::uint32_t p = 0; p < stages; ++p)
      for (std::uint32_t t = 0; t < T; ++t)
        places.push_back(options.pipeline.places[p]);
  auto layout = mesh::create({{"data", D}, {"pipeline", stages}, {"tensor", T}}, places);
  if (!layout)
    return layout.error_value();
  st->layout.emplace(std::move(*layout));
  const auto& grid = *st->layout;

  // Join every group at once (a join waits for its members).
  st->groups.resize(grid.size());
  std::vector<std::optional<troupe::error>> failures(grid.size());
  {
    std::vector<std::thread> joins;
    for (std::uint32_t rank = 0; rank < grid.size(); ++rank)
      joins.emplace_back([&, rank] {
        auto o = grid.group_options(rank, "tensor");
        o.timeout = options.pipeline.timeout;
        auto joined = reducer_group::join(node, o);
        if (joined)
          st->groups[rank].emplace(std::move(*joined));
        else
          failures[rank] = joined.error_value();
      });
    for (auto& j : joins)
      j.join();
  }
  for (std::uint32_t rank = 0; rank < grid.size(); ++rank)
    if (failures[rank])
      return make_error(failures[rank]->code(), "tensor_parallel_pipeline: rank {}'s tensor-parallel group: {}", rank,
                        failures[rank]->message());

  // Each (d, t)'s model: stage p's layers from the model built over (d, p, t)'s group.
  partition split;
  try { // as across processes (below): a factory's refusal is this call's error
    for (std::uint32_t d = 0; d < D; ++d)
      for (std::uint32_t t = 0; t < T; ++t) {
        auto assembled = std::make_shared<nn::sequential>();
        for (std::uint32_t p = 0; p < stages; ++p) {
          // Stage p's layers, from the model built over its group.
          auto& group = *st->groups[(d * stages + p) * T + t];
          auto layers = build_kept_layers(
            [&] { return options.model(group); },
            [&](const nn::sequential& whole) {
              split = split_for(options, stages, whole);
              return layer_range{split.begin(p), split.end(p)};
            },
            fmt::format("stage {}", p))
                          .kept;
          for (std::size_t i = 0; i < layers->size(); ++i)
            assembled->append(layers->at(i)); // named by index, as in the whole model
        }
        st->models.push_back(std::move(assembled));
      }
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, "tensor_parallel_pipeline: {}", e.what());
  }

  for (std::uint32_t d = 0; d < D; ++d)
    for (std::uint32_t t = 0; t < T; ++t) {
      auto o = options.pipeline;
      o.model = st->models[d * T + t];
      o.split = split;
      try {
        o.loss = options.loss(*st->groups[(d * stages + stages - 1) * T + t]);
      } catch (const std::exception& e) {
        return make_error(errc::invalid_argument, "tensor_parallel_pipeline: the loss factory: {}", e.what());
      }
      o.name = fmt::format("d{}.t{}", d, t);
      o.fixed_order = true;
      if (D > 1) {
        pipeline_replication r;
        r.index = d;
        r.places.assign(D, options.pipeline.places);
        r.tag = fmt::format("t{}", t);
        o.replication = std::move(r);
      }
      auto made = pipeline::create(node, std::move(o));
      if (!made)
        return make_error(made.error_value().code(), "tensor_parallel_pipeline: replica {}, tensor rank {}: {}", d, t,
                          made.error_value().message());
      st->pipelines.push_back(std::move(*made));
    }
  return tensor_parallel_pipeline(std::move(st));
}

expected<tensor_parallel_pipeline> tensor_parallel_pipeline::create(troupe::job& job,
                                                                    tensor_parallel_pipeline_options options) {
  if (!options.pipeline.in_this_process)
    return create_across_processes(job, std::move(options));
  auto made = create(job.node(), std::move(options));
  if (made)
    for (auto& p : made->state_->pipelines)
      p.state_->stop_with(job);
  return made;
}

expected<tensor_parallel_pipeline> tensor_parallel_pipeline::create_across_processes(
    troupe::job& job, tensor_parallel_pipeline_options options) {
  validate(options);
  const auto T = options.tensor, D = options.data, world = job.world_size();
  require(world % (T * D) == 0, "tensor_parallel_pipeline: {} processes for {} tensor ranks x {} replicas; across "
          "processes every rank of the mesh is one process, so the processes must be a multiple of tensor x data",
          world, T, D);
  const auto stages = world / (T * D);
  auto places = options.pipeline.places.empty() ? job.places() : options.pipeline.places;
  require(places.size() == world, "tensor_parallel_pipeline: {} places for {} processes; across processes give "
          "every rank's place, by rank (or none: the job's)", places.size(), world);
  auto st = std::make_unique<state>();
  st->data = D;
  st->tensor = T;
  auto layout = mesh::create({{"data", D}, {"pipeline", stages}, {"tensor", T}}, places);
  if (!layout)
    return layout.error_value();
  st->layout.emplace(std::move(*layout));
  const auto& grid = *st->layout;
  const auto rank = job.rank();
  const auto d = grid.coordinate(rank, "data"), p = grid.coordinate(rank, "pipeline"),
             t = grid.coordinate(rank, "tensor");

  // This rank's stage, built over its group (the join waits for the group).
  auto group_options = grid.group_options(rank, "tensor");
  group_options.timeout = options.pipeline.timeout;
  auto joined = reducer_group::join(job.node(), group_options);
  if (!joined)
    return make_error(joined.error_value().code(), "tensor_parallel_pipeline: rank {}'s tensor-parallel group: {}",
                      rank, joined.error_value().message());
  st->groups.resize(grid.size());
  auto& group = st->groups[rank].emplace(std::move(*joined));
  partition split;
  auto prepared = std::make_shared<prepared_stage>();
  // The program's factories refuse layouts they cannot take (a degree
  // that leaves a rank without a head), often from a command-line flag:
  // that is this call's error, not the process's end.
  std::shared_ptr<nn::sequential> whole;
  loss_function loss;
  try {
    auto [built, kept] = build_kept_layers(
      [&] { return options.model(group); },
      [&](const nn::sequential& model) {
        split = split_for(options, stages, model);
        return layer_range{split.begin(p), split.end(p)};
      },
      fmt::format("stage {}", p));
    whole = std::move(built);
    prepared->layers = std::move(kept);
    loss = options.loss(group);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, "tensor_parallel_pipeline: rank {}: {}", rank, e.what());
  }
  prepared->name = fmt::format("d{}.t{}.stage{}", d, t, p);
  prepared->begin = split.begin(p);
  prepared->end = split.end(p);
  prepared->optimizer = options.pipeline.optimizer;
  if (p + 1 == stages)
    prepared->loss = loss;
  register_prepared_stage(job.node(), prepared);
  st->prepared = std::move(prepared);
  auto* released = st.get();
  st->release = finish_hook(job, [released] {
    released->pipelines.clear();
    released->prepared.reset();
    released->ready.reset();
    released->groups.clear();
  });

  // Every process has its stage ready once all have joined this group.
  auto everyone = mesh::create({{"tp_ready", world}}, places);
  if (!everyone)
    return everyone.error_value();
  auto ready_options = everyone->group_options(rank, "tp_ready");
  ready_options.timeout = options.pipeline.timeout;
  auto ready = reducer_group::join(job.node(), ready_options);
  if (!ready)
    return make_error(ready.error_value().code(), "tensor_parallel_pipeline: waiting for every rank's stage: {}",
                      ready.error_value().message());
  st->ready.emplace(std::move(*ready));
  if (!job.is_driver())
    return tensor_parallel_pipeline(std::move(st));

  // The driver runs the D x T pipelines; stage p of (d, t) is rank (d P + p) T + t's.
  auto rank_of = [&](std::uint32_t dd, std::uint32_t pp, std::uint32_t tt) { return (dd * stages + pp) * T + tt; };
  for (std::uint32_t dd = 0; dd < D; ++dd)
    for (std::uint32_t tt = 0; tt < T; ++tt) {
      auto o = options.pipeline;
      o.places.clear();
      for (std::uint32_t pp = 0; pp < stages; ++pp)
        o.places.push_back(places[rank_of(dd, pp, tt)]);
      o.model = whole; // for the partition's checks only: each stage's process holds its layers
      o.split = split;
      o.loss = loss; // for the checks only: the last stage's process holds its loss
      o.name = fmt::format("d{}.t{}", dd, tt);
      o.fixed_order = true;
      if (D > 1) {
        pipeline_replication r;
        r.index = dd;
        r.places.resize(D);
        for (std::uint32_t k = 0; k < D; ++k)
          for (std::uint32_t pp = 0; pp < stages; ++pp)
            r.places[k].push_back(places[rank_of(k, pp, tt)]);
        r.tag = fmt::format("t{}", tt);
        o.replication = std::move(r);
      }
      auto driver = pipeline::state::started(job.node(), std::move(o), tensor_parallel_stage_factory);
      if (!driver)
        return make_error(driver.error_value().code(), "tensor_parallel_pipeline: replica {}, tensor rank {}: {}", dd,
                          tt, driver.error_value().message());
      (*driver)->stop_with(job);
      st->pipelines.push_back(pipeline(std::move(*driver)));
    }
  return tensor_parallel_pipeline(std::move(st));
}

tensor_parallel_pipeline::tensor_parallel_pipeline(std::unique_ptr<state> st) : state_(std::move(st)) {}
tensor_parallel_pipeline::~tensor_parallel_pipeline() = default;
tensor_parallel_pipeline::tensor_parallel_pipeline(tensor_parallel_pipeline&&) noexcept = default;
tensor_parallel_pipeline& tensor_parallel_pipeline::operator=(tensor_parallel_pipeline&&) noexcept = default;

expected<double> tensor_parallel_pipeline::train_step(const tensor& inputs, const tensor& targets) {
  require(!state_->pipelines.empty(), "tensor_parallel_pipeline::train_step: across processes only the driver (rank "
          "0) trains; the other ranks host their stages (call job.serve())");
  const auto T = state_->tensor;
  // Pipeline d T + t takes replica d's shard; the tensor ranks of a
  // replica compute the same loss.
  auto losses = train_together(
      state_->pipelines, inputs, targets, state_->data, [T](std::size_t k) { return static_cast<std::int64_t>(k / T); },
      [this](std::size_t k) { return name(k); }, "tensor_parallel_pipeline::train_step");
  if (!losses)
    return losses.error_value();
  double sum = 0;
  for (std::size_t k = 0; k < losses->size(); k += T)
    sum += (*losses)[k];
  return sum / static_cast<double>(state_->data);
}

expected<void> tensor_parallel_pipeline::synchronize() {
  require(!state_->pipelines.empty(), "tensor_parallel_pipeline::synchronize: across processes only the driver "
          "(rank 0) trains");
  return synchronize_together(state_->pipelines, [this](std::size_t k) { return name(k); });
}

expected<std::vector<double>> tensor_parallel_pipeline::parameter_digests(std::uint32_t data, std::uint32_t tensor) {
  require(data < state_->data && tensor < state_->tensor,
          "tensor_parallel_pipeline::parameter_digests: replica {} and tensor rank {} of {} x {}", data, tensor,
          state_->data, state_->tensor);
  require(!state_->pipelines.empty(), "tensor_parallel_pipeline::parameter_digests: across processes, on the driver "
          "(rank 0)");
  return state_->pipelines[data * state_->tensor + tensor].parameter_digests();
}

std::vector<pipeline*> tensor_parallel_pipeline_access::pipelines(tensor_parallel_pipeline& tp) {
  std::vector<pipeline*> out;
  for (auto& p : tp.state_->pipelines)
    out.push_back(&p);
  return out;
}

std::uint32_t tensor_parallel_pipeline_access::tensor(const tensor_parallel_pipeline& tp) { return tp.state_->tensor; }

std::string tensor_parallel_pipeline::name(std::size_t k) const {
  return fmt::format("replica {}, tensor rank {}", k / state_->tensor, k % state_->tensor);
}

const mesh& tensor_parallel_pipeline::layout() const {
  return *state_->layout;
}

nn::sequential& tensor_parallel_pipeline::model(std::uint32_t data, std::uint32_t tensor) {
  require(data < state_->data && tensor < state_->tensor,
          "tensor_parallel_pipeline::model: replica {} and tensor rank {} of {} x {}", data, tensor, state_->data,
          state_->tensor);
  require(!state_->models.empty(), "tensor_parallel_pipeline::model: the stages are in other processes (compare "
          "them with parameter_digests)");
  return *state_->models[data * state_->tensor + tensor];
}

} // namespace troupe::parallel
