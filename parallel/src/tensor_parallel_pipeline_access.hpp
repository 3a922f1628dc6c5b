#pragma once
// What parallel::checkpoints reaches behind tensor_parallel_pipeline's
// public surface (internal).
#include <cstdint>
#include <vector>

#include "troupe/parallel/tensor_parallel_pipeline.hpp"

namespace troupe::parallel {

struct tensor_parallel_pipeline_access {
  /// The pipeline of (replica d, tensor rank t) at d T + t.
  static std::vector<pipeline*> pipelines(tensor_parallel_pipeline& tp);
  /// T, the tensor-parallel degree.
  static std::uint32_t tensor(const tensor_parallel_pipeline& tp);
};

} // namespace troupe::parallel
