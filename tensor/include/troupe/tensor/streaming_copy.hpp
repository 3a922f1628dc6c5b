#pragma once
// Copies meant for another process, not for this core's cache.
//
// A large memcpy into shared memory first reads every destination line into
// the cache (read-for-ownership) and then leaves the copy in this core's
// caches, where its consumer, another process, gains little from it.
// Streaming (non-temporal) stores write whole lines past the cache instead.
// Measured on this 2-vCPU AMD EPYC (one thread, destination in /dev/shm,
// 2026-11-24): 19.2 against 11.6 GB/s at 16 MiB, 14-15 against 8.3-8.9 at
// 64 MiB. Below a few MiB the copy usually fits the last-level cache, where
// the consumer reads it faster: memcpy there.
#include <cstddef>

namespace troupe {

/// From this size up streaming_copy streams (when the CPU can).
inline constexpr std::size_t streaming_copy_min_bytes = std::size_t{4} << 20;

/// Copies `bytes` from `src` to `dst` (the ranges must not overlap): with
/// streaming stores when the CPU has AVX2 and `bytes` is at least
/// streaming_copy_min_bytes, with std::memcpy otherwise. Any alignment.
void streaming_copy(void* dst, const void* src, std::size_t bytes) noexcept;

} // namespace troupe
