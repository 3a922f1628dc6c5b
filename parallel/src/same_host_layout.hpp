#pragma once
// The layout of a same-host workspace segment (same_host_workspace.hpp
// narrates the protocol): a control page, then `slot_count` slots of
// pass_bytes each. Every rank maps every other rank's segment, so this is
// a format between processes; the workspace checks what it reads from a
// peer's header before it uses it. Tests include it to play a peer.
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace troupe::parallel::same_host_layout {

constexpr std::uint64_t magic = 0x3277'6570'756f'7274; // "troupew2", little-endian
constexpr std::uint32_t slot_count = 2;                  // passes in flight per rank
constexpr std::size_t control_bytes = 4096;

/// What a slot's pass belongs to.
enum class collective : std::uint32_t { allreduce = 1, reduce_scatter = 2, all_gather = 3, broadcast = 4 };

/// One pass's slot, as its owner announces it. `published` and `reduced`
/// hold pass numbers; the plain fields are written before the release
/// store of `published` and read after an acquire load that saw it.
struct alignas(64) slot_header {
  std::atomic<std::uint32_t> published{0};
  std::uint32_t element_bytes = 0;
  std::uint32_t kind = 0; // a collective
  std::uint64_t id = 0;
  std::uint64_t count = 0;      // elements of the whole collective
  std::uint64_t pass_index = 0; // which pass of the collective
  /// Where the owner's values are: `in_slot`, or the offset of its whole
  /// tensor in its node's arena (read in place).
  std::uint64_t source = 0;
  /// Where the owner's values are in its own process, for the peers to read
  /// with process_vm_readv (an all-gather's piece); 0: nowhere, take them
  /// from `source`.
  std::uint64_t address = 0;
  alignas(64) std::atomic<std::uint32_t> reduced{0};
};
constexpr std::uint64_t in_slot = ~std::uint64_t{0};
/// A broadcast's `source` on every rank but the root: it has no values.
constexpr std::uint64_t no_values = in_slot - 1;

/// The head of every segment. Counters sit on lines of their own: peers
/// poll them while the owner writes its other fields.
struct control {
  std::uint64_t magic = 0;
  std::uint64_t nonce = 0;
  std::uint64_t pass_bytes = 0;
  std::uint32_t slots = 0;
  std::uint32_t rank = 0;
  std::uint64_t pid = 0;          // the owner's process, for process_vm_readv
  std::uint64_t base_address = 0; // where the owner mapped this segment: a probe reads `magic` there
  alignas(64) std::atomic<std::uint32_t> doorbell{0}; // futex word: bumped by every publish
  alignas(64) std::atomic<std::uint32_t> sleepers{0}; // waiters asleep on the doorbell
  alignas(64) std::atomic<std::uint32_t> ready{0};    // set up: every peer mapped
  std::uint32_t reads_peers = 0; // 1: this rank can read every peer's memory (set before `ready`)
  alignas(64) std::atomic<std::uint32_t> released{0}; // last pass this rank has finished reading
  slot_header slot[slot_count];
};
static_assert(sizeof(control) <= control_bytes);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

inline std::size_t segment_bytes(std::size_t pass_bytes) { return control_bytes + slot_count * pass_bytes; }

} // namespace troupe::parallel::same_host_layout
