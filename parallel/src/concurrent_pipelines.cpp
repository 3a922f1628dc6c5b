// Several pipelines stepped together (concurrent_pipelines.hpp).
#include "concurrent_pipelines.hpp"

#include <algorithm>
#include <future>
#include <optional>

#include "pipeline_state.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

namespace {

/// Tells each pipeline the nodes of all of them: a stage of one waits in
/// collectives for the stages of the others, so a node lost under another
/// pipeline must end this one's step too (pipeline_state.hpp,
/// linked_nodes_), not leave it waiting for its timeout.
void link(std::vector<pipeline>& pipelines) {
  std::vector<std::string> nodes;
  for (auto& p : pipelines)
    for (const auto& place : pipeline_access::state(p).places_)
      if (std::find(nodes.begin(), nodes.end(), place.node) == nodes.end())
        nodes.push_back(place.node);
  for (auto& p : pipelines)
    pipeline_access::state(p).linked_nodes_ = nodes;
}

} // namespace

expected<std::vector<double>> train_together(std::vector<pipeline>& pipelines, const tensor& inputs,
                                             const tensor& targets, std::int64_t shards,
                                             const std::function<std::int64_t(std::size_t k)>& shard_of,
                                             const pipeline_namer& name, const char* who) {
  require(inputs.rank() >= 1 && targets.rank() >= 1 && inputs.size(0) == targets.size(0),
          "{}: inputs {} and targets {} must have the same number of rows", who, inputs.shape(), targets.shape());
  require(inputs.size(0) % shards == 0,
          "{}: {} rows do not split into {} equal shards (replicas average their gradients, which equals the whole "
          "batch's only for equal shards)",
          who, inputs.size(0), shards);
  const auto rows = inputs.size(0) / shards;
  link(pipelines);
  std::vector<std::future<expected<double>>> steps;
  for (std::size_t k = 0; k < pipelines.size(); ++k)
    steps.push_back(std::async(std::launch::async, [&, k] {
      const auto shard = shard_of(k);
      return pipelines[k].train_step(inputs.slice(0, shard * rows, (shard + 1) * rows),
                                     targets.slice(0, shard * rows, (shard + 1) * rows));
    }));
  std::vector<double> losses;
  std::optional<troupe::error> failed;
  for (std::size_t k = 0; k < steps.size(); ++k) {
    auto loss = steps[k].get();
    if (!loss && !failed)
      failed = make_error(loss.error_value().code(), "{}: {}", name(k), loss.error_value().message());
    else if (loss)
      losses.push_back(*loss);
  }
  if (failed)
    return *failed;
  return losses;
}

expected<void> synchronize_together(std::vector<pipeline>& pipelines, const pipeline_namer& name) {
  std::optional<troupe::error> failed;
  for (std::size_t k = 0; k < pipelines.size(); ++k)
    if (auto done = pipelines[k].synchronize(); !done && !failed)
      failed = make_error(done.error_value().code(), "{}: {}", name(k), done.error_value().message());
  if (failed)
    return *failed;
  return {};
}

} // namespace troupe::parallel
