#pragma once
// Broadcast over a reducer_group, pipelined along the ring: the root cuts
// the tensor into chunks and sends them right; every other rank, in ring
// order from the root, copies each chunk in as it arrives and forwards the
// received tensor unchanged to its right, except the last (root - 1). Chunk
// c+1 travels while chunk c is copied further down the ring. On one host it
// takes the shared-memory path instead (reducer_group.hpp): the root copies
// each pass into its slot once and every other rank copies it out.
#include <cstdint>

#include "troupe/parallel/reducer_group.hpp"

namespace troupe::parallel {

struct broadcast_options {
  std::uint32_t root = 0;
  std::uint64_t context_id = 0; ///< 0: the group's next_id()
};

/// Overwrites `data` (contiguous float32 or float64, same numel everywhere)
/// on every rank with the root's values.
expected<void> broadcast(reducer_group& group, const tensor& data, broadcast_options options = {});

} // namespace troupe::parallel
