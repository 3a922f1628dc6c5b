#pragma once
// Reduce-scatter over a reducer_group: phase 1 (and 2 for average) of the
// ring allreduce (ring_allreduce.hpp) on its own. Rank r sends segment r-s-1
// at step s and reduces segment r-s-2 from its left neighbour; a reduced
// chunk moves right at once, so sends overlap reductions. After N-1 steps
// rank r owns segment r (ring_segment(count, N, r)) summed over all ranks.
// On one host it takes the shared-memory path instead (reducer_group.hpp).
#include <cstdint>

#include "troupe/parallel/reducer_group.hpp"
#include "troupe/parallel/ring_allreduce.hpp"

namespace troupe::parallel {

struct reduce_scatter_options {
  reduce_op op = reduce_op::sum;
  std::uint64_t context_id = 0; ///< 0: the group's next_id()
};

/// Returns this rank's reduced segment of `input` (contiguous float32 or
/// float64, same numel on every rank), flat; `input` is not modified.
expected<tensor> reduce_scatter(reducer_group& group, const tensor& input, reduce_scatter_options options = {});

} // namespace troupe::parallel
