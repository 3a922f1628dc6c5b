#pragma once
// The caching allocator behind CPU storage.
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace troupe {

/// Hands out 64-byte aligned host memory (blocks of 2 MiB and more on huge
/// pages where the kernel allows) and keeps freed blocks of 64 KiB and
/// more for reuse, keyed by size (like PyTorch's caching allocator for
/// CUDA). A training step allocates the same activation and gradient sizes
/// every iteration; without the cache each large block is a fresh mmap
/// whose pages fault in again (measured: ~3% of an MLP training step on two
/// cores). The cache is bounded (`limit()` bytes, default 1 GiB, or
/// TROUPE_HOST_CACHE_MB from the environment); beyond it blocks go back to
/// the system. Thread-safe.
class host_allocator {
public:
  static constexpr std::size_t alignment = 64;
  /// Blocks below this size go straight to malloc's own free lists.
  static constexpr std::size_t min_cached_bytes = std::size_t{64} << 10;
  /// Blocks of this size and more are mapped on their own, aligned to it and
  /// advised to use transparent huge pages (host_allocator.cpp says why).
  static constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

  /// The process-wide instance.
  static host_allocator& instance();

  /// At least `bytes` (zero allowed) of memory aligned to `alignment`;
  /// throws std::bad_alloc. Free with `deallocate(p, bytes)` with the same
  /// `bytes`.
  void* allocate(std::size_t bytes);
  /// As allocate, with every byte zero (calloc's contract). A block mapped
  /// for it is zero already and is not written, so its pages take no memory
  /// until used: a model whose pipeline stage keeps a few of its layers
  /// (nn::deferred_init) builds the others without holding them.
  void* allocate_zeroed(std::size_t bytes);
  void deallocate(void* data, std::size_t bytes) noexcept;

  /// Bytes currently held in the cache (not in use by any tensor).
  std::size_t cached_bytes() const;
  std::size_t limit() const noexcept { return limit_; }
  void set_limit(std::size_t bytes);
  /// Returns every cached block to the system.
  void release_cached();

  explicit host_allocator(std::size_t limit);
  ~host_allocator();
  host_allocator(const host_allocator&) = delete;
  host_allocator& operator=(const host_allocator&) = delete;

private:
  static std::size_t block_size(std::size_t bytes) noexcept;
  /// A cached block of `size`, or nullptr.
  void* take_cached(std::size_t size);
  /// A new block of `size` from the system (new_block, then again after
  /// releasing the cache); throws std::bad_alloc.
  void* new_block_or_throw(std::size_t size);
  /// From the system, by size: malloc below huge_page_bytes, a mapping of
  /// its own from there; nullptr when out of memory. free_block undoes it.
  static void* new_block(std::size_t size) noexcept;
  static void free_block(void* block, std::size_t size) noexcept;
  void trim_to(std::size_t bytes); // requires mutex_

  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks_;
  std::size_t cached_ = 0;
  std::size_t limit_;
};

} // namespace troupe
