#pragma once
// Private helpers: dtype dispatch and strided iteration for CPU kernels.
#include <array>
#include <cstdint>
#include <type_traits>

#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::detail {

template <class T> using tag = std::type_identity<T>;

/// Calls f(tag<T>{}) for the C++ type T of any dtype.
template <class F> decltype(auto) dispatch_any(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: return f(tag<float>{});
    case dtype::float64: return f(tag<double>{});
    case dtype::int64: return f(tag<std::int64_t>{});
    case dtype::int32: return f(tag<std::int32_t>{});
    case dtype::uint8: return f(tag<std::uint8_t>{});
    case dtype::bfloat16: return f(tag<bfloat16>{});
  }
  TROUPE_ASSERT(false, "dispatch_any: invalid dtype {}", static_cast<int>(t));
}

/// Calls f(tag<T>{}) for float32/float64; throws usage_error naming `op`
/// for any other dtype.
template <class F> decltype(auto) dispatch_floating(dtype t, const char* op, F&& f) {
  switch (t) {
    case dtype::float32: return f(tag<float>{});
    case dtype::float64: return f(tag<double>{});
    default: break;
  }
  throw usage_error(fmt::format("{}: expected float32 or float64, got {}", op, t));
}

/// Calls f(tag<T>{}) for float32, float64, int64 and int32 — the dtypes the
/// arithmetic, reduction and index kernels implement. Ops check dtypes first,
/// so anything else reaching a kernel is a bug in troupe (names `kernel`).
template <class F> void dispatch_arithmetic(dtype t, const char* kernel, F&& f) {
  switch (t) {
    case dtype::float32: return f(tag<float>{});
    case dtype::float64: return f(tag<double>{});
    case dtype::int64: return f(tag<std::int64_t>{});
    case dtype::int32: return f(tag<std::int32_t>{});
    default: break;
  }
  TROUPE_ASSERT(false, "{} kernel called with dtype {}", kernel, t);
}

/// Converts between element types, with bfloat16 going through float.
template <class To, class From> inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else if constexpr (std::is_same_v<From, bfloat16>)
    return static_cast<To>(static_cast<float>(v));
  else if constexpr (std::is_same_v<To, bfloat16>)
    return bfloat16(static_cast<float>(v));
  else
    return static_cast<To>(v);
}

/// Iterates the index space `shape` in row-major order for N operands whose
/// element strides are given, calling
/// `inner(offsets, count, inner_strides)` once per innermost row, where
/// offsets[k] is operand k's element offset at the row's start. Lets kernels
/// keep a tight loop over the last dimension whatever the layout.
template <std::size_t N, class Inner>
void for_each_row(const dims& shape, const std::array<const dims*, N>& strides,
                  std::array<std::int64_t, N> base, Inner&& inner) {
  const auto rank = static_cast<std::int64_t>(shape.size());
  for (auto s : shape)
    if (s == 0)
      return;
  if (rank == 0) {
    std::array<std::int64_t, N> inner_strides{};
    inner(base, std::int64_t{1}, inner_strides);
    return;
  }
  std::array<std::int64_t, N> inner_strides{};
  for (std::size_t k = 0; k < N; ++k)
    inner_strides[k] = (*strides[k])[rank - 1];
  const auto count = shape[rank - 1];
  dims index(rank - 1, 0);
  auto offsets = base;
  while (true) {
    inner(offsets, count, inner_strides);
    // Odometer increment over the outer dimensions.
    std::int64_t d = rank - 2;
    for (; d >= 0; --d) {
      ++index[d];
      for (std::size_t k = 0; k < N; ++k)
        offsets[k] += (*strides[k])[d];
      if (index[d] < shape[d])
        break;
      for (std::size_t k = 0; k < N; ++k)
        offsets[k] -= (*strides[k])[d] * shape[d];
      index[d] = 0;
    }
    if (d < 0)
      return;
  }
}

} // namespace troupe::detail
