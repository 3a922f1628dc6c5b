// Hybrid pipeline x data parallelism (hybrid.hpp).
#include "troupe/parallel/hybrid.hpp"

#include <fmt/format.h>

#include "concurrent_pipelines.hpp"
#include "pipeline_state.hpp"
#include "troupe/autograd/nn/deferred_init.hpp"
#include "troupe/job.hpp"

namespace troupe::parallel {

expected<hybrid_pipeline> hybrid_pipeline::create(troupe::job& job, hybrid_options options) {
  if (!options.recipe.model)
    options.recipe = job.stages();
  if (options.places.empty()) {
    const auto places = job.places(options.where.to_string());
    require(options.replicas >= 1 && places.size() % options.replicas == 0,
            "hybrid_pipeline::create: replicas is {} but must divide the job's {} processes", options.replicas,
            places.size());
    const auto stages = places.size() / options.replicas;
    for (std::size_t k = 0; k < options.replicas; ++k)
      options.places.emplace_back(places.begin() + static_cast<std::ptrdiff_t>(k * stages),
                                  places.begin() + static_cast<std::ptrdiff_t>((k + 1) * stages));
  }
  auto made = create(job.node(), std::move(options));
  if (made)
    for (auto& replica : made->replicas_)
      replica.state_->stop_with(job);
  return made;
}

expected<hybrid_pipeline> hybrid_pipeline::create(actors::node& node, hybrid_options options) {
  const auto replicas = options.places.size();
  require(replicas >= 2, "hybrid_pipeline: {} replicas; need at least two (or use a pipeline)", replicas);
  require(options.pipeline.places.empty() && !options.pipeline.model && !options.pipeline.in_this_process,
          "hybrid_pipeline: set places and the recipe in hybrid_options, not in its pipeline options");
  hybrid_pipeline out;
  for (std::size_t k = 0; k < replicas; ++k) {
    auto o = options.pipeline;
    // Replica k's model, built for its size and this process's stages: the
    // layers that other processes hold get no values (deferred_init.hpp).
    nn::deferred_init deferred;
    o.model = options.recipe.model ? options.recipe.model() : nullptr;
    o.optimizer = options.recipe.optimizer;
    o.loss = options.recipe.loss;
    o.places = options.places[k];
    o.name = fmt::format("r{}", k);
    pipeline_replication r;
    r.index = static_cast<std::uint32_t>(k);
    r.places = options.places;
    r.bucket_bytes = options.bucket_bytes;
    o.replication = std::move(r);
    auto created = pipeline::state::started(node, std::move(o), stage_factory_name, &deferred);
    if (!created)
      return make_error(created.error_value().code(), "hybrid_pipeline: replica {}: {}", k,
                        created.error_value().message());
    out.replicas_.push_back(pipeline(std::move(*created)));
  }
  return out;
}

expected<double> hybrid_pipeline::train_step(const tensor& inputs, const tensor& targets) {
  const auto n = static_cast<std::int64_t>(replicas_.size());
  // One driver thread per replica: their steps meet in the stages' rings.
  auto losses = train_together(
      replicas_, inputs, targets, n, [](std::size_t k) { return static_cast<std::int64_t>(k); },
      [](std::size_t k) { return fmt::format("replica {}", k); }, "hybrid_pipeline::train_step");
  if (!losses)
    return losses.error_value();
  double sum = 0;
  for (double loss : *losses)
    sum += loss;
  return sum / static_cast<double>(n);
}

expected<void> hybrid_pipeline::synchronize() {
  return synchronize_together(replicas_, [](std::size_t k) { return fmt::format("replica {}", k); });
}

} // namespace troupe::parallel
