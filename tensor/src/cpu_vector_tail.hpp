#pragma once
// Private: how the vector files (cpu_vector_*.cpp, compiled with -mavx2)
// run a kernel over n elements a whole vector at a time, the last partial
// vector included. Like them it includes no C++ standard header with
// inline functions (cpu_vector_lanes.hpp says why).
#include <cstdint>

#include <immintrin.h>

namespace troupe::detail::vector_math {

namespace tail_detail {

template <class T> struct writable {
  static constexpr bool value = true;
  using type = T;
};
template <class T> struct writable<const T> {
  static constexpr bool value = false;
  using type = T;
};

/// Calls f with a zero-padded copy of the first `count` elements of every
/// operand, then writes the copies of the non-const operands back.
template <int width, class F> void with_padded_copies(std::int64_t, F f) { f(); }

template <int width, class F, class T, class... More>
void with_padded_copies(std::int64_t count, F f, T* first, More*... more) {
  typename writable<T>::type copy[width] = {};
  for (std::int64_t k = 0; k < count; ++k)
    copy[k] = first[k];
  with_padded_copies<width>(count, [&](auto*... copies) { f(copy, copies...); }, more...);
  if constexpr (writable<T>::value)
    for (std::int64_t k = 0; k < count; ++k)
      first[k] = copy[k];
}

} // namespace tail_detail

/// Runs `whole(operands + i...)` for every full vector of `width` elements,
/// and once more on zero-padded copies of the last partial vector (the
/// non-const operands' copies written back), so no kernel reads or writes
/// past n and an element's result does not depend on where it lies.
template <int width, class Whole, class... T>
void over_vectors(std::int64_t n, Whole whole, T*... operands) {
  std::int64_t i = 0;
  for (; i + width <= n; i += width)
    whole((operands + i)...);
  if (i < n)
    tail_detail::with_padded_copies<width>(n - i, whole, (operands + i)...);
}

/// Outputs of at least this many bytes are written with streaming stores:
/// twice a core's L2 where this was chosen, so they leave the caches before
/// anyone reads them anyway, and a streaming store skips the read of each
/// line that a cached store makes first (a third of a round trip's memory
/// traffic).
inline constexpr std::int64_t streaming_min_bytes = std::int64_t{4} << 20;

/// Converts n elements from x to y, `width` per call, each call writing one
/// whole vector of output (width * sizeof(Out) bytes): `cached` throughout
/// below streaming_min_bytes of output; above, `cached` up to y's first
/// vector boundary and for the last partial vector, `streamed` (which may
/// assume y aligned to the vector) in between. The bits are the same
/// either way. Pass the two as lambdas, not function pointers: a pointer
/// is called indirectly for every vector, a lambda's body is inlined.
template <int width, class In, class Out, class Cached, class Streamed>
void over_vectors_streaming(std::int64_t n, Cached cached, Streamed streamed, const In* x, Out* y) {
  constexpr auto bytes = static_cast<std::int64_t>(width * sizeof(Out));
  static_assert(bytes == 32 || bytes == 64, "one call writes one 32- or 64-byte vector");
  if (n * static_cast<std::int64_t>(sizeof(Out)) < streaming_min_bytes) {
    over_vectors<width>(n, cached, x, y);
    return;
  }
  const auto past = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(y) % bytes);
  const std::int64_t head = past == 0 ? 0 : (bytes - past) / static_cast<std::int64_t>(sizeof(Out));
  over_vectors<width>(head, cached, x, y);
  std::int64_t i = head;
  for (; i + width <= n; i += width)
    streamed(x + i, y + i);
  // Streaming stores are weakly ordered: make them visible before anything
  // that follows, another thread's read of the tensor included.
  _mm_sfence();
  over_vectors<width>(n - i, cached, x + i, y + i);
}

} // namespace troupe::detail::vector_math
