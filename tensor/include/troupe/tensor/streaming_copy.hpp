#pragma once
// Copies meant for another process, not for this core's cache.
//
// A large memcpy into shared memory first reads every destination line into
// the cache (read-for-ownership) and then leaves the copy in this core's
// caches, where its consumer, another process, gains little from it.
// Streaming (non-temporal) stores write whole lines past the cache instead,
// 1.6-1.8x faster from 16 MiB into /dev/shm (docs/performance.md, "Figures behind defaults").
// Below a few MiB the copy usually fits the last-level cache, where the
// consumer reads it faster: memcpy there.
#include <cstddef>

namespace troupe {

/// From this size up streaming_copy streams (when the CPU can).
inline constexpr std::size_t streaming_copy_min_bytes = std::size_t{4} << 20;

/// Copies `bytes` from `src` to `dst` (the ranges must not overlap): with
/// streaming stores when the CPU has AVX2 and `bytes` is at least
/// streaming_copy_min_bytes, with std::memcpy otherwise. Any alignment.
void streaming_copy(void* dst, const void* src, std::size_t bytes) noexcept;

} // namespace troupe
