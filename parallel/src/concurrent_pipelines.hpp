#pragma once
// Several pipelines stepped together (hybrid.hpp's replicas,
// tensor_parallel_pipeline.hpp's replicas and tensor ranks): their stages
// meet in collectives, so each pipeline's step needs a driver thread of its
// own; none may wait for another's caller.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "troupe/parallel/pipeline.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

/// Names pipeline k in errors ("replica 1", "replica 1, tensor rank 0").
using pipeline_namer = std::function<std::string(std::size_t k)>;

/// Steps every pipeline at once, pipeline k on equal shard `shard_of(k)`
/// of `shards` of the batch; each pipeline's loss, or the first error
/// prefixed by its name. usage_error (naming `who`) for inputs and targets
/// whose rows differ or do not split into equal shards (averaging over
/// replicas equals the whole batch's gradient only for equal shards).
expected<std::vector<double>> train_together(std::vector<pipeline>& pipelines, const tensor& inputs,
                                             const tensor& targets, std::int64_t shards,
                                             const std::function<std::int64_t(std::size_t k)>& shard_of,
                                             const pipeline_namer& name, const char* who);

/// synchronize() of every pipeline, also after a failure (each waits at
/// most its timeout); the first error prefixed by its pipeline's name.
expected<void> synchronize_together(std::vector<pipeline>& pipelines, const pipeline_namer& name);

} // namespace troupe::parallel
