#pragma once
// Same-host tensors by reference: a POSIX shared-memory arena (docs/design.md,
// "Beyond copies").
//
// The protocol, step by step:
//  1. The owner creates an arena (shm_open + ftruncate + mmap, bounded size)
//     and allocates tensors in it like in any memory.
//  2. share() turns a tensor in the arena into an arena_handoff: the arena's
//     name, the region's offset and length, and the codec header (dtype,
//     shape, strides, meta). The caller sends that small record to the other
//     process (control plane or data plane); the bytes stay where they are.
//  3. The receiver's arena_mapper maps the arena once (by name), validates
//     the record against the mapping and the header, and wraps the region as
//     a tensor without copying. When the last view of that tensor goes, its
//     deleter calls the release function the caller gave the mapper, which
//     sends the arena_ref back to the owner.
//  4. The owner's release() marks the region free once its own tensor is
//     gone too. Nothing is freed while the other side may still read it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "troupe/actors/tensor_message.hpp"
#include "troupe/serialization/message_meta.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::actors {

/// A region of a named arena.
struct arena_ref {
  std::string arena;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  friend bool operator==(const arena_ref&, const arena_ref&) = default;
};

/// What travels to the other process instead of the bytes.
struct arena_handoff {
  arena_ref region;
  /// The codec header frame of the tensor (encode()'s header_bytes()).
  std::vector<std::byte> header;
};

/// The owner's arena. Thread-safe.
class shared_arena {
public:
  class state;

  /// Largest arena accepted (by create() and by arena_mapper).
  static constexpr std::uint64_t max_bytes = std::uint64_t{1} << 40;

  /// "/troupe-<job>-<node>": a valid shm name from two labels (characters
  /// other than [A-Za-z0-9_.] become '_').
  static std::string name_for(std::string_view job, std::string_view node);

  /// Unlinks the arenas that process `pid` created and left behind: a
  /// killed process cannot unlink its own, and its name (with any pages
  /// touched) would stay in /dev/shm until reboot. Routers name their arena
  /// "/troupe-<token hex>_<pid>-<node>"; only names of that form with this
  /// pid are removed. For whoever started the process and has reaped it
  /// (the launcher, tests). Returns how many were removed.
  static std::size_t remove_left_by(long pid);

  /// remove_left_by for every process whose arena names are in /dev/shm
  /// but that no longer exists (kill(pid, 0) says ESRCH): what a crash that
  /// nobody reaped left (an aborted process, a killed benchmark). A router
  /// runs it before creating its own arena. Processes of another pid
  /// namespace that share this /dev/shm would look gone: give such
  /// containers their own /dev/shm, as container runtimes do by default.
  static std::size_t remove_left_by_gone_processes();

  /// Creates an arena of `bytes` (rounded up to whole 64-byte blocks) under
  /// `name` ("/troupe-..."). A stale arena of that name (a crashed run) is
  /// unlinked and replaced.
  static expected<std::unique_ptr<shared_arena>> create(std::string name, std::size_t bytes);

  /// Unmaps and unlinks the name; regions still mapped elsewhere stay valid
  /// there (POSIX semantics), regions still shared are never reused.
  ~shared_arena();
  shared_arena(const shared_arena&) = delete;
  shared_arena& operator=(const shared_arena&) = delete;

  /// A contiguous tensor in the arena, 64-byte aligned; errc::size_limit_exceeded
  /// when the arena has no room.
  expected<tensor> allocate(const dims& shape, dtype type = dtype::float32);

  /// Hands `value` (a contiguous tensor allocated here) to another process
  /// by reference; its region stays allocated until release().
  expected<arena_handoff> share(const message_meta& meta, const tensor& value);

  /// share() without the header: the region of `value`, counted as shared
  /// until release() (the data plane encodes the header itself).
  expected<arena_ref> share_region(const tensor& value);

  /// Whether `value`'s memory lies in this arena (and could be shared).
  bool contains(const tensor& value) const noexcept;

  /// The other side is done with `region` (its release message arrived).
  /// Errors for a region that is not shared (unknown, or released twice).
  expected<void> release(const arena_ref& region);

  const std::string& name() const noexcept;
  std::size_t capacity() const noexcept;
  /// Bytes allocated (held here or shared out).
  std::size_t used_bytes() const;
  /// Regions shared out and not yet released.
  std::size_t shared_regions() const;
  /// Base address of this process's mapping (tests).
  const void* base() const noexcept;

private:
  explicit shared_arena(std::shared_ptr<state> s);
  std::shared_ptr<state> state_;
};

/// The receiver's side: maps arenas by name, once each, and wraps handed-off
/// regions as tensors. Thread-safe.
class arena_mapper {
public:
  /// Sends `region` back to its owner (called from the deleter of the last
  /// view, on whatever thread drops it; must not block long).
  using release_function = std::function<void(const arena_ref& region)>;

  explicit arena_mapper(release_function release,
                        std::uint64_t max_arena_bytes = shared_arena::max_bytes);
  ~arena_mapper();
  arena_mapper(const arena_mapper&) = delete;
  arena_mapper& operator=(const arena_mapper&) = delete;

  /// The handed-off tensor, aliasing the shared region (no copy). Every
  /// field is validated first: the name, offset and length against the
  /// mapped arena, and the header (decode_header) against the length.
  expected<tensor_message> open(const arena_handoff& handoff);

  /// Arenas mapped so far.
  std::size_t mapped_arenas() const;

private:
  struct mapping;
  struct state;
  std::shared_ptr<state> state_;
};

/// Which regions of the owner's arena each peer holds: a region handed to a
/// peer is lent to it until that peer's release message names it. A release
/// that does not match a loan (forged, repeated, or from another peer) is
/// refused, so a peer can never free what it does not hold; the loans of a
/// lost peer are all taken back at once. Thread-safe.
class arena_loans {
public:
  void lend(const std::string& peer, const arena_ref& region);
  /// Ends one loan of `region` to `peer`; errc::invalid_argument when there is none.
  expected<void> give_back(const std::string& peer, const arena_ref& region);
  /// Ends every loan to `peer` and returns the regions (one entry per loan).
  std::vector<arena_ref> take_all(const std::string& peer);
  /// Loans outstanding to `peer` (all peers when empty).
  std::size_t outstanding(const std::string& peer = {}) const;

private:
  struct key {
    std::string arena;
    std::uint64_t offset;
    std::uint64_t length;
    auto operator<=>(const key&) const = default;
  };
  mutable std::mutex mutex_;
  std::map<std::string, std::map<key, std::uint32_t>> loans_; // peer -> region -> count
};

} // namespace troupe::actors
