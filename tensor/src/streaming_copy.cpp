#include "troupe/tensor/streaming_copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace troupe {

namespace {

#if defined(__x86_64__)
bool has_avx2() noexcept {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

/// `bytes` a multiple of 128, `dst` 32-byte aligned.
__attribute__((target("avx2"))) void stream_lines(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
  auto* d = reinterpret_cast<__m256i*>(dst);
  const auto* s = reinterpret_cast<const __m256i*>(src);
  for (std::size_t i = 0; i < bytes / 32; i += 4) {
    const __m256i a = _mm256_loadu_si256(s + i), b = _mm256_loadu_si256(s + i + 1);
    const __m256i c = _mm256_loadu_si256(s + i + 2), e = _mm256_loadu_si256(s + i + 3);
    _mm256_stream_si256(d + i, a);
    _mm256_stream_si256(d + i + 1, b);
    _mm256_stream_si256(d + i + 2, c);
    _mm256_stream_si256(d + i + 3, e);
  }
  // Streaming stores are weakly ordered: make them visible before whatever
  // announces the copy to another process.
  _mm_sfence();
}
#endif

} // namespace

void streaming_copy(void* dst, const void* src, std::size_t bytes) noexcept {
#if defined(__x86_64__)
  if (bytes >= streaming_copy_min_bytes && has_avx2()) {
    auto* d = static_cast<std::byte*>(dst);
    const auto* s = static_cast<const std::byte*>(src);
    // Head up to a 32-byte aligned destination, whole 128-byte blocks
    // streamed, the tail copied.
    const std::size_t head = (32 - reinterpret_cast<std::uintptr_t>(d) % 32) % 32;
    std::memcpy(d, s, head);
    const std::size_t body = (bytes - head) / 128 * 128;
    stream_lines(d + head, s + head, body);
    std::memcpy(d + head + body, s + head + body, bytes - head - body);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

} // namespace troupe
