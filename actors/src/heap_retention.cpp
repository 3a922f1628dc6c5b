// Keeping freed heap memory mapped (heap_retention.hpp).
#include "heap_retention.hpp"

#include <algorithm>
#include <climits>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace troupe::actors::detail {

bool keep_freed_heap(std::size_t largest_block, std::size_t keep_bytes) {
#if defined(__GLIBC__)
  if (keep_bytes == 0)
    return false;
  // glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on
  // 64-bit): larger blocks are always mapped on their own.
  constexpr std::size_t most_from_heap = std::size_t{32} << 20;
  // Never below glibc's own first threshold: smaller blocks would be mapped
  // one by one, each a fresh set of pages.
  constexpr std::size_t glibc_default = std::size_t{128} << 10;
  static std::mutex mutex;
  static std::size_t block = glibc_default, keep = 0;
  std::lock_guard guard(mutex);
  block = std::max(block, std::min(largest_block, most_from_heap));
  keep = std::max(keep, std::min<std::size_t>(keep_bytes, INT_MAX));
  // Setting either one also stops glibc adjusting both by itself.
  return ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(block)) == 1 &&
         ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(keep)) == 1;
#else
  (void)largest_block;
  (void)keep_bytes;
  return false;
#endif
}

} // namespace troupe::actors::detail
