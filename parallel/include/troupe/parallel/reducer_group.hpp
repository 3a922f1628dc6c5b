#pragma once
// A ring of reducer actors, one per replica (docs/design.md, "reducer"). Each rank
// owns one reducer, registered under `<node>/cpu/<prefix><rank>`, and the
// ring is rank order: rank r receives from r-1 and sends to r+1 (mod N).
//
// Every member joins with its rank and the places of all members, by rank
// (places_for(2) is reducer_places({"worker0", "worker1"}), that is
// "worker0/cpu/reducer0" and "worker1/cpu/reducer1"); join waits until all
// are registered and returns expected<reducer_group>, a movable handle.
// From tests/parallel/collectives_test.cpp:
//
//   auto group = reducer_group::join(*c.coordinator,
//                                    {.rank = 0, .places = places_for(2), .timeout = 3000ms, .same_host = path});
//   ...
//   auto ok = ring_allreduce(*group, data);
//
// What is made on a group (data_parallel, nccl_communicator) shares its
// member: the rank leaves the ring when the handle and all of those are
// gone, or when the job it was joined from finishes.
//
// ring_allreduce sums by default; {.op = reduce_op::average} averages.
// Despite the name, small collectives (up to 256 KiB; see options.messages)
// run by recursive halving-doubling instead of the ring by default.
//
// The collectives (ring_allreduce.hpp, reduce_scatter.hpp, all_gather.hpp,
// broadcast.hpp; collectives.hpp includes them all) run on the calling thread
// and block it, every wait bounded by `timeout`; `*_async` variants return a
// std::future. Call them from a plain thread or from a detached actor (never
// from an event-based actor's handler: they block).
//
// Planes. Every chunk goes through the node's tensor_router to the next
// reducer's place: in one process a zero-copy CAF message, across processes
// the UCX data plane. The reducer actor (detached) files each arriving chunk
// in a mailbox keyed by (collective id, ring step, chunk index), so
// concurrent collectives with different ids never mix; the collective
// running on the caller's thread takes its chunks from there.
//
// One host. When every member runs on this host (the same host key, see
// tensor_router), allreduce does not go through the ring's messages: each
// rank maps every member's shared-memory workspace and moves each byte once
// between processes (parallel/src/same_host_workspace.hpp narrates the
// protocol). Joining decides it: every member tells every other whether it
// wants that path, its host and its workspace; all of them agree or none
// takes it. A tensor allocated with buffer() lies in the node's shared
// arena: an allreduce's is read by the peers where it lies, an all-gather's
// output (all_gather_into, all_gather) is written by them. Reduce-scatter,
// all-gather and broadcast take the shared-memory path too (a
// reduce-scatter's sums are the allreduce's, bit for bit). These
// collectives run one at a time per group, in call order, so replicas must
// issue them in the same order (as with NCCL or MPI; a mismatch, or a
// broadcast whose replicas name different roots, is an error naming the
// replica and both collectives, never a wrong result).
//
// Failure. A member's node lost (node::on_peer_lost), a refused send, or no
// chunk from the left neighbour within `timeout` fails the collective with
// an error naming the replica (rank and place); nothing waits forever.
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/actors/node.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {
class job;
}

namespace troupe::parallel {

/// How an allreduce runs when every member is on this host.
enum class same_host_algorithm {
  shared_memory, ///< each rank reads the others' workspaces: one copy between processes
  ring,          ///< the ring's messages, as between hosts
};

/// How allreduce, reduce-scatter and all-gather run over the members'
/// messages: between hosts, and on one host when same_host is `ring`.
/// Both move 2(n-1)/n of the data per rank; they differ in how many steps
/// each pays a hop's latency and a wake-up for.
enum class message_algorithm {
  ring,             ///< 2(n-1) steps to the right neighbour, chunks pipelined
  halving_doubling, ///< 2 log2(n) steps to partners rank ^ 2^j; n a power of two
  /// halving_doubling for collectives of at most 256 KiB, where a step's
  /// latency outweighs its bytes (on a group whose size is not a power of
  /// two, allreduces of at most 64 KiB: the extra members fold into the
  /// others, two exchanges of the whole vector more); the ring otherwise.
  automatic,
};

/// "ring", "halving-doubling" or "automatic": the names --troupe.collectives
/// takes and join errors use.
std::string_view name_of(message_algorithm algorithm);
/// The algorithm of that name; invalid_argument naming `name` otherwise.
expected<message_algorithm> message_algorithm_named(std::string_view name);

struct reducer_group_options {
  /// This replica's rank in the ring, 0 <= rank < places.size().
  std::uint32_t rank = 0;
  /// Every member's place, by rank (`<node>/cpu/reducer<k>`). places[rank]
  /// must be on this node. Several members may share a node (tests).
  std::vector<std::string> places{};
  /// Bytes per chunk: each ring segment is cut into chunks this large so
  /// that sending chunk k+1 overlaps reducing chunk k. 1 MiB measured
  /// best of 256 KiB - 2 MiB (docs/performance.md, "Figures behind defaults").
  std::size_t chunk_bytes = std::size_t{1} << 20;
  /// A segment shorter than `min_chunks` chunks is still cut into up to
  /// `min_chunks` chunks, none shorter than `min_chunk_bytes` (1: off).
  /// Off by default: 4 helped one size on 2 processes and slowed others
  /// (docs/performance.md, "Figures behind defaults").
  std::uint32_t min_chunks = 1;
  std::size_t min_chunk_bytes = std::size_t{64} << 10;
  /// Bound on every wait: joining, and each chunk of a collective.
  std::chrono::milliseconds timeout{10000};
  /// Allreduce when every member is on this host (members on several hosts
  /// always use the ring). Every member must choose the same.
  same_host_algorithm same_host = same_host_algorithm::shared_memory;
  /// Bytes of one pass of the same-host allreduce (each rank's workspace
  /// holds two), a multiple of 64 in [4096, 2^30]. 256 KiB measured best of
  /// 128 KiB - 4 MiB: passes that leave the cache are slower
  /// (docs/performance.md, "Figures behind defaults").
  std::size_t same_host_pass_bytes = std::size_t{256} << 10;
  /// On the same-host path, let the peers read an all-gather's pieces
  /// straight from this process's memory (process_vm_readv, where the
  /// system allows it) rather than through a shared slot: one copy instead
  /// of two for outputs on the heap. Off: always the slots.
  bool same_host_single_copy = true;
  /// Collectives over messages (members on several hosts, or same_host =
  /// ring). Unset: the node's `collectives` option (--troupe.collectives,
  /// automatic unless given), so a job can change it without a rebuild.
  /// halving_doubling needs a group whose size is a power of two. It beats
  /// the ring on small collectives and loses to it on large ones over
  /// shaped links, hence automatic by default (docs/scaling.md, "Recursive
  /// halving-doubling"). Every member must choose the same: joining checks
  /// it. Broadcast always runs as a chain from the root. options() after
  /// joining holds the algorithm chosen.
  std::optional<message_algorithm> messages{};
};

/// The default places for `size` members with one rank per node:
/// `<node_names[k]>/cpu/reducer<k>`.
std::vector<std::string> reducer_places(const std::vector<std::string>& node_names);

class reducer_member;

class reducer_group {
public:
  /// Spawns this rank's reducer (detached), registers it under its place,
  /// and waits (at most `timeout`) until every other member is registered.
  static expected<reducer_group> join(actors::node& node, reducer_group_options options);
  /// Every rank of the job in one ring: rank and places (reducer_places of
  /// the job's nodes) from the job when `options.places` is empty. The
  /// job's finish() leaves the ring.
  static expected<reducer_group> join(troupe::job& job, reducer_group_options options = {});

  /// Leaves the ring (unregisters and stops this rank's reducer) unless an
  /// object made on the group still uses it.
  ~reducer_group();
  reducer_group(reducer_group&&) noexcept;
  reducer_group& operator=(reducer_group&&) noexcept;
  reducer_group(const reducer_group&) = delete;
  reducer_group& operator=(const reducer_group&) = delete;

  std::uint32_t rank() const noexcept;
  std::uint32_t size() const noexcept;
  const reducer_group_options& options() const noexcept;
  const actors::place& place_of(std::uint32_t rank) const;
  /// "replica 2 (worker2/cpu/reducer2)".
  std::string describe(std::uint32_t rank) const;

  /// Whether allreduce takes the same-host path (decided when joining).
  bool shares_memory() const noexcept;

  /// A contiguous, uninitialised tensor for this group's allreduces: in
  /// this node's shared arena when they take the same-host path (the peers
  /// then read it where it lies: one copy fewer per allreduce, see
  /// same_host_workspace.hpp), on the heap otherwise or when the arena has
  /// no room. Gradient buckets of data_parallel come from here.
  tensor buffer(const dims& shape, dtype type = dtype::float32);

  /// A fresh collective id (same sequence on every rank when every rank
  /// issues its collectives in the same order). Explicit ids passed in the
  /// options must stay below 2^63.
  std::uint64_t next_id() noexcept;

private:
  friend struct reducer_group_access; // parallel/'s own code reaches the member
  explicit reducer_group(std::shared_ptr<reducer_member> member);
  std::shared_ptr<reducer_member> member_;
};

} // namespace troupe::parallel
