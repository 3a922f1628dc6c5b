#pragma once
// All-gather over a reducer_group: phase 3 of the ring allreduce
// (ring_allreduce.hpp) on its own. Rank r places its tensor at segment r of
// the output, sends it right, and for N-1 steps receives segment r-s-1 from
// the left, copies it in, and forwards the received tensor unchanged.
// On one host it takes the shared-memory path instead (reducer_group.hpp).
#include <cstdint>

#include "troupe/parallel/reducer_group.hpp"

namespace troupe::parallel {

struct all_gather_options {
  std::uint64_t context_id = 0; ///< 0: the group's next_id()
};

/// Concatenates every rank's `mine` (contiguous float32 or float64, the same
/// numel on every rank) in rank order into one flat tensor. The tensor comes
/// from group.buffer(): on one host it lies in the node's shared arena and
/// the peers write their pieces into it. (A caller that keeps many large
/// results there leaves less of the arena to same-host messages, which then
/// go through the data plane instead; all_gather_into a heap tensor avoids
/// that.)
expected<tensor> all_gather(reducer_group& group, const tensor& mine, all_gather_options options = {});

/// The same into `out`: contiguous, of mine's dtype and group.size() times
/// its numel (PyTorch's all_gather_into_tensor). On one host every piece
/// is copied once: with `out` from group.buffer() its owner writes it
/// there; with `out` on the heap this rank reads pieces of 32 KiB or more
/// from their owners' memory (process_vm_readv, where the system allows
/// it) and smaller ones through their owners' shared slots (two copies).
expected<void> all_gather_into(reducer_group& group, const tensor& mine, const tensor& out,
                               all_gather_options options = {});

} // namespace troupe::parallel
