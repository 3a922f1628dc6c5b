#pragma once
// The buffers the data plane receives payloads into (step 3 of "Flow
// control, step by step" in data_plane.cpp): 64-byte aligned blocks from
// the host allocator's cache that UCX pulls a rendezvous payload into, or
// an eager one is copied into, and that the delivered tensor then aliases.
// The pool remembers which blocks are lent, so tests can check that a
// delivered tensor is the very buffer UCX wrote (data_plane::
// is_receive_buffer). Kept apart because a buffer outlives the message
// that filled it: it goes back when its tensor's last view does.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "troupe/tensor/storage.hpp"

namespace troupe::actors::detail {

/// Thread-safe: buffers are lent on the transport thread and come back on
/// whichever thread drops the last view of their tensor.
class receive_buffer_pool {
public:
  /// A 64-byte aligned buffer of `bytes`; the tensor that aliases it
  /// returns it to the host allocator's cache when its last view goes
  /// away. `pool` is kept alive until then (the data plane passes a pointer
  /// that shares ownership of the whole plane).
  static std::shared_ptr<storage> lend(std::shared_ptr<receive_buffer_pool> pool,
                                       std::size_t bytes);

  /// Whether `p` lies inside a buffer lent and not yet returned.
  bool contains(const void* p) const;

private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> lent_; // start address -> bytes
};

} // namespace troupe::actors::detail
