#pragma once
// Keeping freed heap memory mapped, so the buffers UCX assembles eager
// messages in do not come back as fresh pages.
//
// UCX 1.13 assembles an eager message of several fragments (every tensor up
// to network_eager_bytes sent to another host) in a block it mallocs, and
// the delivered tensor keeps that block until its last view goes. glibc
// serves such blocks from a fresh mmap, or from a heap whose free top it
// gives back to the kernel (trims) once it exceeds 128 KiB (twice the
// largest block freed so far, when adjusting itself). Either way the next
// message's block is new pages: one fault and one cleared page per 4 KiB,
// paid on the data plane's thread before a byte is copied, and that thread
// is the bound of a fast stream (docs/performance.md, "Eager messages
// into kept memory").
//
// Setting glibc's thresholds (mallopt) is process-wide: the process keeps
// up to the threshold of freed heap memory instead of returning it, as
// caching allocators do (host_allocator keeps up to 1 GiB of tensor blocks).
#include <cstddef>

namespace troupe::actors::detail {

/// Blocks of up to `largest_block` bytes (at least glibc's first 128 KiB,
/// at most its 32 MiB) come from the heap, and up to `keep_bytes` of freed
/// heap stays mapped.
/// Later calls only raise the two settings. Does nothing when `keep_bytes`
/// is 0 or where the C library is not glibc. Returns whether glibc took
/// the settings.
bool keep_freed_heap(std::size_t largest_block, std::size_t keep_bytes);

} // namespace troupe::actors::detail
