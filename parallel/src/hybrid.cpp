// Hybrid pipeline x data parallelism (hybrid.hpp).
#include "troupe/parallel/hybrid.hpp"

#include <future>

#include <fmt/format.h>

#include "pipeline_state.hpp"
#include "troupe/job.hpp"

namespace troupe::parallel {

expected<hybrid_pipeline> hybrid_pipeline::create(troupe::job& job, hybrid_options options) {
  if (!options.recipe.model)
    options.recipe = job.stages();
  if (options.places.empty()) {
    const auto places = job.places();
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
    auto created = pipeline::create(node, std::move(o));
    if (!created)
      return make_error(created.error_value().code(), "hybrid_pipeline: replica {}: {}", k,
                        created.error_value().message());
    out.replicas_.push_back(std::move(*created));
  }
  return out;
}

expected<double> hybrid_pipeline::train_step(const tensor& inputs, const tensor& targets) {
  const auto n = static_cast<std::int64_t>(replicas_.size());
  require(inputs.rank() >= 1 && targets.rank() >= 1 && inputs.size(0) == targets.size(0),
          "hybrid_pipeline::train_step: inputs {} and targets {} must have the same number of rows",
          inputs.shape(), targets.shape());
  require(inputs.size(0) % n == 0,
          "hybrid_pipeline::train_step: {} rows do not split into {} equal shards (replicas average "
          "their gradients, which equals the whole batch's only for equal shards)",
          inputs.size(0), n);
  const auto rows = inputs.size(0) / n;
  // One driver thread per replica: their steps meet in the stages' rings.
  std::vector<std::future<expected<double>>> steps;
  for (std::int64_t k = 0; k < n; ++k)
    steps.push_back(std::async(std::launch::async, [this, k, rows, &inputs, &targets] {
      return replicas_[static_cast<std::size_t>(k)].train_step(inputs.slice(0, k * rows, (k + 1) * rows),
                                                                targets.slice(0, k * rows, (k + 1) * rows));
    }));
  double sum = 0;
  std::optional<troupe::error> failed;
  for (std::int64_t k = 0; k < n; ++k) {
    auto loss = steps[static_cast<std::size_t>(k)].get();
    if (!loss && !failed)
      failed = make_error(loss.error_value().code(), "replica {}: {}", k, loss.error_value().message());
    else if (loss)
      sum += *loss;
  }
  if (failed)
    return *failed;
  return sum / static_cast<double>(n);
}

expected<void> hybrid_pipeline::synchronize() {
  std::optional<troupe::error> failed;
  // Every replica, also after a failure: each waits at most its timeout.
  for (std::size_t k = 0; k < replicas_.size(); ++k)
    if (auto done = replicas_[k].synchronize(); !done && !failed)
      failed = make_error(done.error_value().code(), "replica {}: {}", k, done.error_value().message());
  if (failed)
    return *failed;
  return {};
}

} // namespace troupe::parallel
