#pragma once
// Ring allreduce over a reducer_group (after Gloo's allreduce_ring and
// allreduce_ring_chunked). N ranks, the flat tensor cut into N segments
// (sizes differ by at most one element), each segment cut into chunks of
// about `reducer_group_options::chunk_bytes`.
//
// Protocol, seen from rank r (left = r-1, right = r+1, mod N; segments
// indexed mod N):
//
//   1. Reduce-scatter, N-1 steps. Step 0: send every chunk of segment r-1
//      (this rank's own values) to the right. Step s: for each chunk c of
//      segment r-s-2, wait for it from the left, add it to the local chunk,
//      and immediately send the sum to the right as step s+1. A chunk moves
//      on as soon as it is reduced, so sending chunk c overlaps reducing
//      chunk c+1 (the pipeline), and no rank waits for a whole segment.
//      After step N-2 rank r holds segment r fully reduced, summed along the
//      ring in the same order whichever rank looks at it.
//   2. (average) Rank r divides segment r by N, once, before sharing it.
//   3. All-gather, N-1 steps. Step 0: send segment r's final chunks right
//      (interleaved with the last reduce step, chunk by chunk). Step s: for
//      each chunk of segment r-s-1, wait for it from the left, copy it in,
//      and forward the very tensor received (no copy) to the right.
//
// Every rank ends with bitwise identical values: each element is reduced
// exactly once, on its owner, and the others copy the result.
//
// Cost: 2(N-1)/N of the bytes leave each rank (the busbw factor). Chunks go
// through the tensor router: a zero-copy message between reducers of one
// process, the UCX data plane between processes. Each sent chunk is a copy
// of the local values (the data plane reads it after send() returns, and
// the caller's buffer keeps changing).
#include <cstdint>
#include <future>

#include "troupe/parallel/reducer_group.hpp"

namespace troupe::parallel {

enum class reduce_op { sum, average };

struct allreduce_options {
  reduce_op op = reduce_op::sum;
  /// Collective id; 0 takes the group's next_id(). Collectives that run at
  /// the same time need different ids (the same id on every rank).
  std::uint64_t context_id = 0;
};

/// Reduces `data` (contiguous float32 or float64, same shape on every rank)
/// in place across the group. Errors name the replica that failed.
expected<void> ring_allreduce(reducer_group& group, const tensor& data, allreduce_options options = {});

/// The same on a thread of its own; `data` must outlive the future.
std::future<expected<void>> ring_allreduce_async(reducer_group& group, tensor data, allreduce_options options = {});

/// Segment k of `count` elements cut into `n` parts: [begin, end).
struct ring_range {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};
ring_range ring_segment(std::int64_t count, std::uint32_t n, std::uint32_t k);

} // namespace troupe::parallel
