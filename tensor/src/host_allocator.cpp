#include "troupe/tensor/host_allocator.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

namespace troupe {

namespace {

std::size_t limit_from_environment() {
  constexpr std::size_t default_limit = std::size_t{1} << 30;
  const char* text = std::getenv("TROUPE_HOST_CACHE_MB");
  if (text == nullptr || *text == '\0')
    return default_limit;
  char* end = nullptr;
  auto mb = std::strtoull(text, &end, 10);
  // A malformed value keeps the default rather than disabling the cache
  // by accident; 0 is a valid request to disable it.
  if (end == text || *end != '\0' || mb > (std::size_t{1} << 24))
    return default_limit;
  return static_cast<std::size_t>(mb) << 20;
}

/// A block of `size` bytes (a multiple of 4 KiB) from its own mapping,
/// aligned to the huge page size and marked MADV_HUGEPAGE, or nullptr.
/// Why: this machine class runs transparent huge pages in "madvise" mode, so
/// malloc's large blocks get 4 KiB pages. Moving a tensor between processes
/// is mostly the kernel copying it (send() and recv() over TCP, or
/// process_vm_readv), and on 4 KiB pages those copies miss the TLB every
/// page: a standalone UCX sender and receiver moved 16 MiB messages over
/// loopback TCP about 9% faster with both buffers on huge pages
/// (docs/performance.md, "Figures behind defaults"), and that is how ucx_perftest allocates its
/// buffers.
void* map_huge_block(std::size_t size) {
  constexpr std::size_t huge = host_allocator::huge_page_bytes;
  void* mapping = ::mmap(nullptr, size + huge, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED)
    return nullptr;
  // Keep the aligned part; give back what lies before and after it.
  auto start = reinterpret_cast<std::uintptr_t>(mapping);
  auto aligned = (start + huge - 1) / huge * huge;
  if (aligned > start)
    ::munmap(mapping, aligned - start);
  auto tail = aligned + size;
  auto end = start + size + huge;
  if (end > tail)
    ::munmap(reinterpret_cast<void*>(tail), end - tail);
  auto* block = reinterpret_cast<void*>(aligned);
  // Advice only: without THP the block simply keeps 4 KiB pages.
  (void)::madvise(block, size, MADV_HUGEPAGE);
  return block;
}

} // namespace

host_allocator& host_allocator::instance() {
  // Leaked on purpose: tensors in static objects may be freed after main.
  static auto* allocator = new host_allocator(limit_from_environment());
  return *allocator;
}

host_allocator::host_allocator(std::size_t limit) : limit_(limit) {}

host_allocator::~host_allocator() {
  release_cached();
}

std::size_t host_allocator::block_size(std::size_t bytes) noexcept {
  // Small blocks: a multiple of the alignment (aligned_alloc's rule). Large
  // ones: a multiple of 4 KiB, so sizes that differ by a few bytes share a
  // free list.
  constexpr std::size_t page = 4096;
  if (bytes < min_cached_bytes)
    return bytes == 0 ? alignment : (bytes + alignment - 1) / alignment * alignment;
  return (bytes + page - 1) / page * page;
}

void* host_allocator::allocate(std::size_t bytes) {
  auto size = block_size(bytes);
  if (void* block = take_cached(size))
    return block;
  return new_block_or_throw(size);
}

void* host_allocator::allocate_zeroed(std::size_t bytes) {
  auto size = block_size(bytes);
  if (void* block = take_cached(size)) {
    std::memset(block, 0, size);
    return block;
  }
  void* block = new_block_or_throw(size);
  if (size < huge_page_bytes) // from malloc, which may reuse what was freed
    std::memset(block, 0, size);
  return block;
}

void* host_allocator::take_cached(std::size_t size) {
  if (size < min_cached_bytes)
    return nullptr;
  std::lock_guard guard(mutex_);
  auto it = free_blocks_.find(size);
  if (it == free_blocks_.end() || it->second.empty())
    return nullptr;
  void* block = it->second.back();
  it->second.pop_back();
  cached_ -= size;
  return block;
}

void* host_allocator::new_block_or_throw(std::size_t size) {
  void* block = new_block(size);
  if (block == nullptr) {
    // Memory may be sitting in the cache under other sizes: give it back
    // and try once more before failing.
    release_cached();
    block = new_block(size);
    if (block == nullptr)
      throw std::bad_alloc();
  }
  return block;
}

void* host_allocator::new_block(std::size_t size) noexcept {
  return size >= huge_page_bytes ? map_huge_block(size) : std::aligned_alloc(alignment, size);
}

void host_allocator::free_block(void* block, std::size_t size) noexcept {
  if (size >= huge_page_bytes)
    ::munmap(block, size);
  else
    std::free(block);
}

void host_allocator::deallocate(void* data, std::size_t bytes) noexcept {
  auto size = block_size(bytes);
  if (size >= min_cached_bytes) {
    std::lock_guard guard(mutex_);
    if (cached_ + size <= limit_) {
      try {
        free_blocks_[size].push_back(data);
        cached_ += size;
        return;
      } catch (...) {
        // No memory for the bookkeeping: free the block instead.
      }
    }
  }
  free_block(data, size);
}

std::size_t host_allocator::cached_bytes() const {
  std::lock_guard guard(mutex_);
  return cached_;
}

void host_allocator::set_limit(std::size_t bytes) {
  std::lock_guard guard(mutex_);
  limit_ = bytes;
  trim_to(limit_);
}

void host_allocator::release_cached() {
  std::lock_guard guard(mutex_);
  trim_to(0);
}

void host_allocator::trim_to(std::size_t bytes) {
  for (auto it = free_blocks_.begin(); it != free_blocks_.end() && cached_ > bytes;) {
    auto& blocks = it->second;
    while (!blocks.empty() && cached_ > bytes) {
      free_block(blocks.back(), it->first);
      blocks.pop_back();
      cached_ -= it->first;
    }
    it = blocks.empty() ? free_blocks_.erase(it) : std::next(it);
  }
}

} // namespace troupe
