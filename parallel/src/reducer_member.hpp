#pragma once
// This rank's member of a reducer ring: what a reducer_group handle
// (reducer_group.hpp) shares with the objects made on it (data_parallel,
// nccl_communicator, a stage's replica ring), and the ring's plumbing that
// the collectives use. Private to parallel/.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "troupe/actors/node.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/parallel/reducer_group.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

#include "finish_hook.hpp"

namespace troupe::parallel {

class same_host_workspace;
struct device_collectives; // tensor_parallel_collectives.cpp

class reducer_member {
public:
  /// Spawns and registers this rank's reducer, waits for every member and
  /// agrees on the same-host path (reducer_group::join).
  static expected<std::shared_ptr<reducer_member>> join(actors::node& node, reducer_group_options options);
  /// Leaves the ring (shutdown()).
  ~reducer_member();
  reducer_member(const reducer_member&) = delete;
  reducer_member& operator=(const reducer_member&) = delete;

  std::uint32_t rank() const noexcept { return options_.rank; }
  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(places_.size()); }
  const reducer_group_options& options() const noexcept { return options_; }
  const actors::place& place_of(std::uint32_t rank) const { return places_.at(rank); }
  std::string describe(std::uint32_t rank) const;
  same_host_workspace* workspace() noexcept { return workspace_.get(); }
  tensor buffer(const dims& shape, dtype type);
  std::uint64_t next_id() noexcept;

  /// Where a chunk belongs: collective, ring step, chunk index.
  using key = std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>;

  /// Sends `chunk` (contiguous; never written afterwards) to the right
  /// neighbour's reducer. Retries on back-pressure until the timeout.
  expected<void> send_right(std::uint64_t id, std::uint32_t step, std::uint32_t chunk_index, tensor chunk);
  /// Sends to any member (broadcast's root to its successor is the same call).
  expected<void> send_to(std::uint32_t rank, std::uint64_t id, std::uint32_t step, std::uint32_t chunk_index,
                         tensor chunk);
  /// A buffer for a chunk of `count` elements to send to `to`: in this
  /// node's shared arena when `to` is another node and the chunk is large
  /// enough for a by-reference handoff to pay (a same-host receiver then
  /// reads it where it lies: one copy, the caller's, instead of two), on
  /// the heap otherwise or when the arena is full.
  tensor chunk_buffer(std::uint32_t to, dtype type, std::int64_t count);
  /// Waits (at most the timeout) for the chunk from rank `from`.
  expected<tensor> receive(std::uint32_t from, std::uint64_t id, std::uint32_t step, std::uint32_t chunk_index);
  /// Drops what is left of a collective (after a failure).
  void forget(std::uint64_t id);

  /// Unregisters and stops the reducer; later collectives fail naming the
  /// reason. Idempotent; the job's finish() calls it too.
  void shutdown();
  /// job::finish() shuts this member down.
  void stop_with(troupe::job& job);

  /// How the group's tensor-parallel collectives move tensors on a GPU
  /// (NCCL, or through the host), once the first of them has decided.
  std::shared_ptr<device_collectives>& device_path() noexcept { return device_path_; }

  struct state; // shared with the reducer actor and the peer-lost handler

private:
  reducer_member(actors::node& node, reducer_group_options options, std::vector<actors::place> places);
  /// Joining's last step: the same-host offers, and the workspace if all
  /// agree; a member with another message algorithm fails the join.
  expected<void> offer_same_host();

  actors::node& node_;
  reducer_group_options options_;
  std::vector<actors::place> places_;
  std::shared_ptr<state> state_;
  struct reducer_actor; // the CAF handle (reducer_group.cpp)
  std::unique_ptr<reducer_actor> reducer_;
  std::uint64_t next_id_ = 0;
  /// This member's place, as the sender of its chunks in traces.
  trace::name_id trace_name_;
  std::uint64_t peer_lost_handler_ = 0;
  finish_hook finish_hook_;
  bool shut_down_ = false;
  std::unique_ptr<same_host_workspace> workspace_;
  std::shared_ptr<device_collectives> device_path_;
};

/// The member behind a handle, for parallel/'s own code.
struct reducer_group_access {
  static reducer_member& member(reducer_group& group) { return *group.member_; }
  static const std::shared_ptr<reducer_member>& shared(reducer_group& group) { return group.member_; }
  /// Another handle on the same member (what data_parallel keeps).
  static reducer_group share(reducer_group& group) { return reducer_group(group.member_); }
  static reducer_group wrap(std::shared_ptr<reducer_member> member) { return reducer_group(std::move(member)); }
};

} // namespace troupe::parallel
