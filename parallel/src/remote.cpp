// The stage factory that every process of a pipeline job registers.
#include "troupe/parallel/remote.hpp"

#include "kept_layers.hpp"
#include "pipeline_state.hpp"
#include "stage.hpp"

#include <optional>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "troupe/actors/error_category.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/job.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/autograd/nn/deferred_init.hpp"

namespace troupe::parallel {

tensor_sender routed_tensor_sender(std::shared_ptr<actors::tensor_router> router, std::string_view sender_name) {
  require(router != nullptr, "routed_tensor_sender: no router (was the node started?)");
  // Weak: the node owns its router; a stage must not keep it alive.
  std::weak_ptr<actors::tensor_router> weak = router;
  const auto sender = sender_name.empty() ? trace::name_id{} : trace::intern(sender_name);
  return [weak, sender](const stage_endpoint& to, actors::tensor_message message) -> expected<void> {
    if (to.where.name.empty())
      return make_error(errc::invalid_argument, "stage {} has no place to send to", to.index);
    auto router = weak.lock();
    if (!router)
      return make_error(errc::io_error, "the node's tensor router has stopped");
    return router->send(to.where, std::move(message), {}, sender);
  };
}

std::shared_ptr<stage_options> stage_from_spec(const stage_spec& spec, const actors::place& where,
                                               actors::node& node, std::shared_ptr<nn::sequential> layers,
                                               const optimizer_factory& optimizer, loss_function loss) {
  auto stage = std::make_shared<stage_options>();
  stage->index = spec.index;
  stage->stages = spec.stages;
  stage->layers = std::move(layers);
  stage->device = where.device;
  stage->layers->to(stage->device);
  stage->optimizer = optimizer(stage->layers->named_parameters());
  stage->loss = std::move(loss);
  stage->rematerialize = spec.rematerialize;
  stage->defer_weight_gradients = spec.defer_weight_gradients;
  stage->fill_idle_with_weight_gradients = spec.fill_idle_with_weight_gradients;
  stage->policy = schedule_policy{.credits = spec.credits, .backward_first = spec.backward_first,
                                  .micro_batches = spec.micro_batches, .fixed_order = spec.fixed_order};
  stage->sender = routed_tensor_sender(node.router(), where.to_string());
  stage->name = where.to_string();
  stage->replication.ring = *ring_places(spec); // validated by stage_spec_from
  stage->replication.rank = static_cast<std::uint32_t>(spec.replica_rank);
  stage->replication.node = &node;
  stage->replication.bucket_bytes = spec.bucket_bytes;
  stage->replication.timeout = std::chrono::milliseconds(spec.ring_timeout_ms);
  return stage;
}

void register_stage_factory(actors::node& node, stage_recipe recipe) {
  require(static_cast<bool>(recipe.model) && static_cast<bool>(recipe.optimizer) &&
            static_cast<bool>(recipe.loss),
          "register_stage_factory: the recipe needs a model, an optimizer and a loss");
  // The node outlives its factories; its router is looked up per spawn.
  auto* owner = &node;
  node.register_factory(
    stage_factory_name,
    [owner, recipe](caf::actor_system& system, const actors::place& where,
                     const caf::message& args) -> caf::expected<caf::actor> {
      // The arguments come from another process: validate before building.
      auto spec = stage_spec_from(args);
      if (!spec)
        return actors::to_caf_error(spec.error_value());
      try {
        auto layers = build_kept_layers(
          recipe.model, [&](const nn::sequential&) { return layer_range{spec->begin, spec->end}; },
          "this process's recipe") // the catch below names the stage
                        .kept;
        auto stage = stage_from_spec(*spec, where, *owner, std::move(layers), recipe.optimizer, recipe.loss);
        return system.spawn<caf::detached>(stage_actor, std::move(stage));
      } catch (const std::exception& e) {
        return actors::make_caf_error(errc::invalid_argument,
                                      fmt::format("pipeline stage {}: {}", where.to_string(), e.what()));
      }
    });
}

expected<pipeline> pipeline::create(troupe::job& job, pipeline_options options) {
  // The recipe's model is built here for its size and this process's
  // stages: the layers that other processes hold get no values
  // (deferred_init.hpp).
  std::optional<nn::deferred_init> deferred;
  if (!options.model) {
    deferred.emplace();
    options.model = job.stages().model();
  }
  if (!options.optimizer)
    options.optimizer = job.stages().optimizer;
  if (!options.loss)
    options.loss = job.stages().loss;
  if (options.places.empty()) {
    options.places = job.places();
    // In this process, the stages of the given split all on the first place.
    if (options.in_this_process && !options.split.boundaries.empty())
      options.places.assign(options.split.stages(), options.places.front());
  }
  auto st = state::started(job.node(), std::move(options), stage_factory_name, deferred ? &*deferred : nullptr);
  if (!st)
    return st.error_value();
  (*st)->stop_with(job);
  return pipeline(std::move(*st));
}

pipeline_options pipeline_options_from(const stage_recipe& recipe) {
  pipeline_options options;
  options.model = recipe.model();
  options.optimizer = recipe.optimizer;
  options.loss = recipe.loss;
  return options;
}

} // namespace troupe::parallel
