#pragma once
// Private: pinned host memory kept for copies from a device that the
// caller waits for later (start_copy_to_host). A copy into pageable memory
// returns only once it has run, so such a copy needs pinned memory; pinning
// costs milliseconds for megabytes (cudaHostAlloc), so blocks are kept and
// reused by size: a pipeline stage sends the same shapes every micro-batch.
#include <cstddef>
#include <map>
#include <mutex>

namespace troupe::detail::cuda {

struct pinned_block {
  void* data = nullptr; ///< nullptr: no pinned memory could be had
  std::size_t capacity = 0;
};

class pinned_host_cache {
public:
  /// Blocks kept beyond this are given back to the system.
  static constexpr std::size_t kept_bytes_limit = std::size_t{256} << 20;

  /// The process's cache (never destroyed: host tensors may outlive main).
  static pinned_host_cache& instance();

  /// A block of at least `bytes`: a kept one of that size class, or a new
  /// one; data == nullptr when none can be had (the caller copies another
  /// way).
  pinned_block take(std::size_t bytes);
  /// Keeps `block` for reuse; no copy may still be writing it.
  void give_back(pinned_block block);

private:
  std::mutex mutex_;
  std::multimap<std::size_t, void*> kept_; // capacity -> block
  std::size_t kept_bytes_ = 0;
};

} // namespace troupe::detail::cuda
