#pragma once
// The same-host allreduce of a reducer_group (private to parallel/).
//
// When every member of a group runs on this host, the ring's messages are
// the wrong tool: each chunk is copied into a message, handed over, and
// read again, and a rank waits for its left neighbour at every one of the
// 2(N-1) steps. Instead each rank owns one POSIX shared-memory segment that
// every other rank maps, and an allreduce moves each byte once between
// processes (Open MPI's "vader" shared-memory component and NCCL's
// single-node paths work the same way):
//
//   The flat tensor is cut into passes of at most `pass_bytes`; each pass
//   into N segments (ring_segment). Seen from rank r, pass s uses slot
//   s % slots of every segment:
//     1. Wait until every peer has finished reading pass s - slots (its
//        `released` counter), so the slot may be written again.
//     2. Copy this rank's values of the other ranks' segments into the slot
//        and publish (slot's collective id, element count, then `published`).
//     3. Wait until every peer has published pass s with the same collective
//        id and count (a different one means the replicas issued their
//        collectives in different orders: an error, never a wrong sum).
//     4. Reduce segment r: sum the N ranks' values in rank order (this
//        rank's own from its tensor, the others' from their slots), average
//        once if asked, write the result to the tensor and to this rank's
//        slot, and publish `reduced`.
//     5. For every peer k, wait for its `reduced` and copy segment k of its
//        slot into the tensor.
//     6. Publish `released` = s.
//   Every element is reduced by exactly one rank in one fixed order and the
//   others copy it, so every rank ends bitwise identical. Steps 1-2 of pass
//   s+1 run before step 3 of pass s (both slots in use): the peers find the
//   next values ready, and the copy fills what would be a wait.
//
// Tensors in the node's shared arena are used where they lie. Each rank
// also announces its node's arena (tensor_router's, the one arena_tensor()
// allocates from), and every peer maps it. A rank whose tensor lies in that
// arena skips both copies: its slot header names the tensor's offset in the
// arena instead, the peers read its values from there in step 4, and each
// owner of a segment writes its result straight into that tensor after
// reducing it (step 4), so step 5 only waits. That is safe because segment
// k of a rank's tensor is read, and then written, by rank k alone (the
// values before its publish of `reduced`, the result after the reduction
// read them), and a rank returns only after every peer has published
// `reduced` for the last pass, i.e. is done with its tensor. Ranks may mix:
// each looks at each peer's header. Trust: the members of a group are one
// job's processes on one host, and each can write the others' arenas.
// Leaving the copy-in out saved 8-29% at 4 MiB (docs/performance.md, "Figures behind defaults").
//
// Cost per rank for B bytes on N ranks: B(N-1)/N copied in, B read and 2B/N
// written by the reduction, B(N-1)/N copied out. With passes of 256 KiB the
// slots stay in cache, so memory sees little more than the tensor read and
// written once (at 64 MiB on 4 ranks that is the machine's memory bandwidth).
//
// Waiting. A waiter spins briefly when the group has no more ranks than
// the host has cores (the peer is running and will answer within
// microseconds), then sleeps on the peer's doorbell futex (every publish
// rings it), checking the group's failure flag and its deadline every few
// milliseconds. Nothing waits longer than the group's timeout.
//
// Order. Collectives on one workspace run one at a time, in the order the
// callers took their tickets (ring_allreduce takes one when called, the
// _async variant on the calling thread). Replicas must issue them in the
// same order, as with NCCL or MPI; step 3 detects when they do not.
//
// Reduce-scatter and all-gather use the same slots, counters and order.
// A reduce-scatter's pass carries a run of each rank's segment of the whole
// tensor (rank r keeps ring_segment(count, N, r)): every rank publishes its
// values of the others' segments, then sums its own in rank order (the
// allreduce's additions, so the same bits) into its output, and nothing is
// copied back. An all-gather's pass carries a run of each rank's piece:
// once every peer has published where its output is, the owner writes the
// run straight into the outputs that lie in their nodes' arenas (one copy,
// as Open MPI's single-copy transport makes) and into its slot for the
// others to copy, then publishes `reduced`. A slot also names its collective's
// kind, so replicas that issue different collectives at the same place
// fail instead of reading each other's values as their own.
//
// Single copy. Where the system lets a process read another's memory
// (process_vm_readv: same user, no ptrace restriction; probed at set-up by
// reading each peer's segment head through its process), an all-gather's
// owner announces where its piece lies in its own process instead of
// copying it into the slot, and the peers with heap outputs copy it
// straight into them, as Open MPI's "cma" single-copy mechanism does. The
// owner then returns only once every peer has released the last pass (its
// caller may change the piece next). Used only when every peer can read
// this way (no pass needs both paths), and for pieces of at least
// single_copy_min_bytes: below that the system call and the final wait
// cost more than the copy saves. A broadcast keeps its slot: there the
// root's one copy serves every reader, and the readers' copies from the
// slot, which is in cache, were as fast or faster than reading the root's
// memory (docs/performance.md, "the same-host broadcast").
//
// After any failure (a timeout, a lost replica, an order mismatch) the
// passes of the ranks are out of step for good: the workspace refuses
// every later collective with the first error.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/tensor/expected.hpp"
#include "troupe/parallel/reducer_group.hpp"

namespace troupe::parallel {

namespace same_host_layout {
enum class collective : std::uint32_t; // same_host_layout.hpp
}

struct same_host_workspace_options {
  std::uint32_t rank = 0;
  std::uint32_t size = 1;
  /// Bytes of one pass (the slot size).
  std::size_t pass_bytes = std::size_t{1} << 20;
  /// Bound on every wait.
  std::chrono::milliseconds timeout{10000};
  /// Returns the group's sticky failure (a lost replica), if any.
  std::function<std::optional<std::string>()> failure;
  /// "replica 2 (worker2/cpu/reducer2)".
  std::function<std::string(std::uint32_t)> describe;
  /// This node's shared arena (name "/troupe-...", this process's mapping
  /// and its size): tensors lying in it are read in place by the peers.
  /// Empty name: none, every tensor goes through the slots.
  std::string arena_name;
  const void* arena_base = nullptr;
  std::size_t arena_bytes = 0;
  /// Let the peers read an all-gather's pieces straight from this
  /// process's memory ("Single copy" above), where the system allows it.
  bool single_copy = true;
};

class same_host_workspace {
public:
  /// The least all-gather piece the peers read from the owner's memory.
  static constexpr std::uint64_t single_copy_min_bytes = 32 << 10;

  /// What a rank tells the others about its segment.
  struct invitation {
    std::string name;
    std::uint64_t nonce = 0;
    std::uint64_t pass_bytes = 0;
    /// The node's shared arena and its size ("" and 0: none).
    std::string arena;
    std::uint64_t arena_bytes = 0;
  };

  /// Creates this rank's segment (named after the process and rank, with a
  /// random nonce, so it never collides with another job's).
  static expected<std::unique_ptr<same_host_workspace>> create(same_host_workspace_options options);

  ~same_host_workspace();
  same_host_workspace(const same_host_workspace&) = delete;
  same_host_workspace& operator=(const same_host_workspace&) = delete;

  invitation own() const;

  /// Maps peer `rank`'s segment, checking its size and nonce against what
  /// the peer announced, and its arena, checking the size.
  expected<void> map_peer(std::uint32_t rank, const invitation& peer);

  /// Once every peer is mapped: marks this rank ready, waits (bounded) until
  /// every peer is ready too, then unlinks this rank's name (the peers hold
  /// mappings, so nothing is left in /dev/shm even after a crash).
  expected<void> finish_setup();

  /// A place in the order of collectives (see "Order").
  std::uint64_t take_ticket();

  /// Allreduces data[0, count) in place (float or double), `id` naming the
  /// collective on every rank. Waits for `ticket`'s turn first.
  template <class T>
  expected<void> allreduce(T* data, std::int64_t count, bool average, std::uint64_t id, std::uint64_t ticket);

  /// Reduce-scatter of data[0, count): out receives the sum (or average) of
  /// every rank's ring_segment(count, size, rank), bitwise what allreduce
  /// leaves there. Each rank copies out only the other ranks' segments and
  /// reduces its own, so nothing comes back: (N-1)/N of the bytes an
  /// allreduce moves out, and no copy of the result.
  template <class T>
  expected<void> reduce_scatter(const T* data, std::int64_t count, T* out, bool average, std::uint64_t id,
                                std::uint64_t ticket);

  /// All-gather: out[k * count, (k + 1) * count) receives rank k's `mine`,
  /// bit for bit (a -0 stays -0). A rank whose `out` lies in its node's
  /// arena has the peers write their pieces straight into it; for the
  /// others each piece goes through its owner's slot.
  template <class T>
  expected<void> all_gather(const T* mine, std::int64_t count, T* out, std::uint64_t id, std::uint64_t ticket);

  /// Broadcast: data[0, count) on every rank becomes the root's, bit for
  /// bit. The root copies each pass into its slot once (a root tensor in
  /// the node's arena is read where it lies instead, and the root returns
  /// once every peer is done with it); every other rank copies it out.
  /// Ranks that disagree on the root fail naming it.
  template <class T>
  expected<void> broadcast(T* data, std::int64_t count, std::uint32_t root, std::uint64_t id, std::uint64_t ticket);

  /// Collectives in which the peers used this rank's arena tensor in place
  /// (an allreduce's or a broadcast root's values read, an all-gather's
  /// output written), and peers' allreduce values this rank read in place
  /// (a count per peer and collective).
  std::uint64_t published_in_place() const noexcept { return published_in_place_.load(); }
  std::uint64_t read_in_place() const noexcept { return read_in_place_.load(); }
  /// Peers' values this rank read straight from their processes' memory (a
  /// count per peer and pass).
  std::uint64_t read_across_processes() const noexcept { return read_across_processes_.load(); }

  struct segment; // one mapped segment: this rank's or a peer's

private:
  using collective = same_host_layout::collective;
  /// What a slot of one pass holds: peers check it before they read.
  struct pass_label {
    collective kind;
    std::uint32_t element_bytes;
    std::uint64_t id;
    std::uint64_t count; // elements of the whole collective
    std::uint64_t index; // which pass of it
  };

  /// The passes of one collective: numbered pass(0), pass(1), ... (wrapping),
  /// each labelled for the peers' checks. An allreduce, an all-gather and a
  /// broadcast cut one range of `count` elements into passes of `per_pass`
  /// from offset(index), the last one shorter (length, bytes); a
  /// reduce-scatter cuts each rank's segment into runs of `per_pass` and
  /// computes its own extents, so offset, length and bytes mean nothing
  /// for it.
  struct pass_plan {
    collective kind;
    std::uint32_t element_bytes;
    std::uint64_t id;
    std::int64_t count;    // elements of the whole collective
    std::int64_t per_pass; // elements of a full pass (a reduce-scatter's: of each segment)
    std::int64_t passes;
    std::uint32_t first;
    std::uint32_t pass(std::int64_t index) const { return first + static_cast<std::uint32_t>(index); }
    std::int64_t offset(std::int64_t index) const { return index * per_pass; }
    std::int64_t length(std::int64_t index) const { return std::min(per_pass, count - offset(index)); }
    std::size_t bytes(std::int64_t index) const { return static_cast<std::size_t>(length(index)) * element_bytes; }
    pass_label label(std::int64_t index) const {
      return {kind, element_bytes, id, static_cast<std::uint64_t>(count), static_cast<std::uint64_t>(index)};
    }
  };

  explicit same_host_workspace(same_host_workspace_options options);

  /// Numbers the next `passes` passes (by default enough for `count` in
  /// passes of `per_pass`) for one collective.
  pass_plan plan_passes(collective kind, std::uint32_t element_bytes, std::uint64_t id, std::int64_t count,
                        std::int64_t per_pass, std::int64_t passes = -1);
  /// The same in passes that fill a slot (pass_bytes each).
  pass_plan plan_passes(collective kind, std::uint32_t element_bytes, std::uint64_t id, std::int64_t count);

  static const char* name_of(collective kind);
  /// Where [data, data + bytes) lies in this node's arena, or in_slot.
  std::uint64_t arena_offset(const void* data, std::uint64_t bytes) const;
  /// Peer k's announced region of its arena, checked to lie inside it,
  /// aligned (errc::malformed_message naming the peer otherwise).
  expected<std::byte*> peer_region(std::uint32_t k, std::uint64_t source, std::uint64_t bytes, std::size_t alignment,
                                   const char* what) const;
  /// Rank `rank`'s slot of pass s.
  template <class T> T* slot_of(std::uint32_t rank, std::uint32_t s) const;
  /// Step 1: waits until every peer has finished reading pass s - slots.
  expected<void> wait_slot_free(std::uint32_t s);
  /// Waits until every peer has finished reading pass s (its `released`);
  /// `what` names the wait in a timeout's error.
  expected<void> wait_all_released(std::uint32_t s, const char* what);
  /// Publishes this rank's slot of pass s (its values already written).
  void announce(std::uint32_t s, const pass_label& label, std::uint64_t source, const void* address = nullptr);
  /// Step 3 for peer k: waits for its slot of pass s and checks that it
  /// holds the same collective; returns where its values are (the header's
  /// `source`, unchecked).
  expected<std::uint64_t> wait_published(std::uint32_t k, std::uint32_t s, const pass_label& label);
  /// Step 3 for every peer: wait_published, then where each peer's values
  /// lie: regions[k] in its arena (checked by peer_region for `bytes`), or
  /// nullptr for its slot. regions[rank] is nullptr.
  template <class T>
  expected<void> wait_all_published(std::uint32_t s, const pass_label& label, std::uint64_t bytes,
                                    std::vector<T*>& regions);
  /// This rank's part of pass s is final (reduced, or handed over).
  void publish_reduced(std::uint32_t s);
  /// Waits until peer k's part of pass s is final; `what` names the wait in
  /// a timeout's error.
  expected<void> wait_reduced(std::uint32_t k, std::uint32_t s, const char* what);
  /// Step 6: this rank is done reading the peers' slots of pass s.
  void release(std::uint32_t s);
  /// The address peer k announced with pass s (after wait_published saw it).
  std::uint64_t announced_address(std::uint32_t k, std::uint32_t s) const;
  /// Copies `bytes` at `address` of peer k's process to `to`
  /// (process_vm_readv); an address the peer does not map is
  /// errc::malformed_message naming the peer.
  expected<void> read_from_peer(std::uint32_t k, std::uint64_t address, void* to, std::size_t bytes,
                                const char* what);
  /// Whether this rank can read every peer's memory: a read of each peer's
  /// segment head through its process must find its magic and nonce.
  bool probe_single_copy() const;

  template <class Pred> expected<void> wait_for(std::uint32_t peer, const char* what, Pred ready);
  /// "replica 2 (worker2/cpu/reducer2)", or "rank 2" without a describe function.
  std::string who(std::uint32_t rank) const;
  expected<void> turn(std::uint64_t ticket);
  void done(std::uint64_t ticket, const expected<void>& result);

  same_host_workspace_options options_;
  std::vector<std::unique_ptr<segment>> segments_; // by rank
  std::uint32_t pass_ = 0;                         // last pass run (wraps)
  bool spin_ = false;
  bool read_by_peers_ = false; // every peer reads this rank's announced addresses (set up in finish_setup)

  std::mutex order_mutex_;
  std::condition_variable order_changed_;
  std::uint64_t next_ticket_ = 0;
  std::uint64_t serving_ = 0;
  std::optional<error> broken_;
  std::atomic<std::uint64_t> published_in_place_{0};
  std::atomic<std::uint64_t> read_in_place_{0};
  std::atomic<std::uint64_t> read_across_processes_{0};
};

/// What every member tells every other when a group is joined: whether it
/// wants the same-host path, which host it is on, and its segment; and the
/// algorithm it runs over messages, which every member must share. Sent as
/// a uint8 tensor through the ring (it comes from another process: the
/// decoder checks every field).
struct same_host_offer {
  bool wants = false;
  std::string host_key;
  same_host_workspace::invitation segment;
  message_algorithm messages = message_algorithm::automatic;
};
std::vector<std::byte> encode_offer(const same_host_offer& offer);
/// errc::malformed_message naming the field that is wrong.
expected<same_host_offer> decode_offer(std::span<const std::byte> bytes);

} // namespace troupe::parallel
