#pragma once
// An NCCL communicator for a ring of reducers on CUDA (docs/design.md, "reducer":
// on CUDA the reducer owns an NCCL communicator, bootstrapped by exchanging
// the NCCL unique id through actor messages, and reduces device buffers with
// NCCL on its own stream).
//
// Each rank creates its communicator from its reducer_group (the actor
// ring, reducer_group.hpp) and the CUDA device it reduces on; the test runs
// rank k as a thread on cuda:k.
// From tests/parallel/nccl_communicator_test.cpp:
//
//   auto c = nccl_communicator::create(*ring.groups[k], {.where = device::cuda(static_cast<std::int32_t>(k)),
//                                                        .timeout = 30000ms});
//   ...
//   data[k] = input(k, count, type).to(device::cuda(static_cast<std::int32_t>(k)));
//   auto ok = comms_[k]->allreduce(data[k], op);
//
// Built only when CMake found CUDA and NCCL (the macro TROUPE_HAVE_NCCL is
// then defined for every user of troupe::parallel); NCCL's and CUDA's types
// stay out of this header.
//
// Bootstrap. create() is a collective of the whole group: rank 0 draws an
// ncclUniqueId and broadcasts its 128 bytes over the group's own ring
// (broadcast.hpp: actor messages in one process, the UCX data plane across
// processes); then every rank joins with ncclCommInitRankConfig on its
// device. The communicator is non-blocking, so joining and every collective
// are bounded by `timeout`: a member that never joins, or a collective that
// does not complete, aborts the communicator (ncclCommAbort) and returns an
// error instead of hanging.
//
// Ordering. Each collective first waits for the tensor backend's work on its
// input, whichever thread queued it (cuda_synchronize), runs on the
// communicator's own stream, and returns when it has completed — like the
// ring collectives, a call blocks its thread. Call the collectives in the
// same order on every rank.
//
// Errors are values: NCCL and CUDA failures name the call, the rank and
// device, and ncclGetErrorString (plus NCCL's last-error detail); a tensor
// that is not a contiguous tensor on this communicator's device is
// errc::invalid_argument. After a failed or timed-out collective the
// communicator is aborted and every later call fails at once.
#include <chrono>
#include <cstdint>
#include <memory>

#include "troupe/parallel/reducer_group.hpp"
#include "troupe/parallel/ring_allreduce.hpp"
#include "troupe/tensor/device.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel {

struct nccl_options {
  /// This rank's GPU; every rank of the group uses its own.
  device where = device::cuda(0);
  /// Bound on joining and on each collective.
  std::chrono::milliseconds timeout{60000};
};

class nccl_communicator {
public:
  /// Creates this rank's communicator; every member of `group` must call it
  /// (concurrently: joining waits for all). Fails at once, before any
  /// message, when `options.where` is not a CUDA device of this process.
  static expected<nccl_communicator> create(reducer_group& group, nccl_options options = {});

  /// Finalizes and destroys the communicator. Finalizing waits until the
  /// communicator is quiescent on every rank, so destroy the ranks'
  /// communicators concurrently (each on its own thread, as they were made);
  /// the wait is bounded by the timeout, after which it is aborted.
  ~nccl_communicator();
  nccl_communicator(nccl_communicator&&) noexcept;
  nccl_communicator& operator=(nccl_communicator&&) noexcept;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  std::uint32_t rank() const noexcept;
  std::uint32_t size() const noexcept;
  device where() const noexcept;

  /// Reduces `data` in place across the ranks (sum, or ncclAvg for average).
  /// Any dtype NCCL has (float32, float64, bfloat16, int32, int64, uint8).
  expected<void> allreduce(const tensor& data, reduce_op op = reduce_op::sum);
  /// Rank r's block r of the reduced `input`, flat: input.numel() must be a
  /// multiple of size(); returns input.numel() / size() elements on this
  /// device. `input` is not modified.
  expected<tensor> reduce_scatter(const tensor& input, reduce_op op = reduce_op::sum);
  /// Every rank's `mine` (same numel everywhere) concatenated in rank order,
  /// flat, on this device.
  expected<tensor> all_gather(const tensor& mine);
  /// Overwrites `data` on every rank with rank `root`'s values.
  expected<void> broadcast(const tensor& data, std::uint32_t root = 0);

  struct impl; // NCCL and CUDA handles (nccl_communicator.cpp)

private:
  explicit nccl_communicator(std::unique_ptr<impl> state);

  std::unique_ptr<impl> impl_;
};

} // namespace troupe::parallel
