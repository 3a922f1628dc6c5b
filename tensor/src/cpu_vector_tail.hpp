#pragma once
// Private: how the vector files (cpu_vector_*.cpp, compiled with -mavx2)
// run a kernel over n elements a whole vector at a time, the last partial
// vector included. Like them it includes no C++ standard header with
// inline functions (cpu_vector_lanes.hpp says why).
#include <cstdint>

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

} // namespace troupe::detail::vector_math
