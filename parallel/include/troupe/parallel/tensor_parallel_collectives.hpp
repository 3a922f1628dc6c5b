#pragma once
// Collectives that autograd differentiates, for tensor parallelism (issue
// 20): one layer's weights split over the members of a reducer group, the
// layer written as ordinary ops between these. They are Megatron-LM's
// conjugate pairs:
//
//   copy_to_group       forward: identity            backward: allreduce (sum)
//   reduce_from_group   forward: allreduce (sum)     backward: identity
//   scatter_to_group    forward: this rank's piece   backward: all-gather
//   gather_from_group   forward: all-gather          backward: this rank's piece
//   reduce_scatter_to_group  forward: reduce-scatter  backward: all-gather
//   all_gather_from_group    forward: all-gather      backward: reduce-scatter
//
// (the last pair is sequence parallelism's: activations split along the
// sequence around LayerNorm and dropout). Pieces along a dimension follow
// tensor_parallel_split: with `total` not divisible by the degree the first
// total % degree ranks hold one element more, so any size works.
//
// Every member must make the same calls in the same order (forward and
// backward alike), as with any collective of the group. They run on the
// calling thread over the group's ring (or its shared memory on one host),
// float32 and float64. Tensors on GPUs: where every member has a GPU of
// its own, NCCL (the group's first collective on a GPU decides, on every
// member alike, and makes the communicator); where members share a GPU,
// through the host, the results copied back onto the GPU (the same sums,
// bit for bit, as on the CPU). A collective that fails (a lost member, a
// timeout) throws std::runtime_error naming the member, from forward or
// from backward; wrong arguments throw usage_error.
#include <cstdint>

#include "troupe/autograd/variable.hpp"
#include "troupe/parallel/reducer_group.hpp"

namespace troupe::parallel {

/// One rank's piece of a dimension of `total` elements cut over `degree`
/// ranks: [offset, offset + size). The first total % degree ranks hold
/// one more (a rank may hold none when total < degree).
struct shard_range {
  std::int64_t offset = 0;
  std::int64_t size = 0;
};
shard_range tensor_parallel_split(std::int64_t total, std::uint32_t degree, std::uint32_t rank);

autograd::variable copy_to_group(const autograd::variable& x, reducer_group& group);
autograd::variable reduce_from_group(const autograd::variable& x, reducer_group& group);
/// This rank's piece of `x` along `dim` (every rank passes the whole `x`).
autograd::variable scatter_to_group(const autograd::variable& x, reducer_group& group, std::int64_t dim);
/// Every rank's piece of a dimension of `total` elements, joined in rank
/// order along `dim`; `x` holds this rank's piece.
autograd::variable gather_from_group(const autograd::variable& x, reducer_group& group, std::int64_t dim,
                                     std::int64_t total);
/// The sum over the group of `x` (the same shape everywhere), this rank's
/// piece along `dim`.
autograd::variable reduce_scatter_to_group(const autograd::variable& x, reducer_group& group, std::int64_t dim);
/// gather_from_group whose backward sums the gradient over the group before
/// taking this rank's piece (sequence parallelism: what follows the gather
/// is replicated work whose gradients differ by rank).
autograd::variable all_gather_from_group(const autograd::variable& x, reducer_group& group, std::int64_t dim,
                                         std::int64_t total);
/// The same where the whole size is not known here: the members' piece
/// sizes are gathered first (one more collective, of one value each) and
/// must be tensor_parallel_split's.
autograd::variable all_gather_from_group(const autograd::variable& x, reducer_group& group, std::int64_t dim);

} // namespace troupe::parallel
