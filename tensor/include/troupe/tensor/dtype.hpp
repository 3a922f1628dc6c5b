#pragma once
// Element types and the bfloat16 storage type.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "troupe/tensor/fwd.hpp"

namespace troupe {

/// Element type of a tensor. The numeric values are part of the wire format
/// (serialization/) and of checkpoint files: never renumber, only append.
enum class dtype : std::uint8_t {
  float32 = 0,
  float64 = 1,
  int64 = 2,
  int32 = 3,
  uint8 = 4,
  bfloat16 = 5,
};

/// Number of dtypes; valid wire values are [0, dtype_count).
inline constexpr int dtype_count = 6;

/// bfloat16: the upper 16 bits of an IEEE float32. Used for storage and
/// conversion; arithmetic converts to float32 first.
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  /// Rounds to nearest, ties to even; NaN stays a (quiet) NaN.
  explicit bfloat16(float value) {
    auto u = std::bit_cast<std::uint32_t>(value);
    if (std::isnan(value)) {
      bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<std::uint16_t>(u >> 16);
  }
  explicit operator float() const {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  friend bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }
};

/// Size of one element in bytes.
constexpr std::size_t size_of(dtype t) {
  switch (t) {
    case dtype::float32: return 4;
    case dtype::float64: return 8;
    case dtype::int64: return 8;
    case dtype::int32: return 4;
    case dtype::uint8: return 1;
    case dtype::bfloat16: return 2;
  }
  return 0;
}

constexpr std::string_view name_of(dtype t) {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::int64: return "int64";
    case dtype::int32: return "int32";
    case dtype::uint8: return "uint8";
    case dtype::bfloat16: return "bfloat16";
  }
  return "invalid";
}

/// True for float32, float64 and bfloat16.
constexpr bool is_floating(dtype t) {
  return t == dtype::float32 || t == dtype::float64 || t == dtype::bfloat16;
}

/// The dtype for a wire value, or nullopt when it names none.
constexpr std::optional<dtype> dtype_from_wire(std::uint32_t value) {
  if (value >= static_cast<std::uint32_t>(dtype_count))
    return std::nullopt;
  return static_cast<dtype>(value);
}

/// Maps C++ element types to dtypes.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::float32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::float64; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::int64; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::int32; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::uint8; };
template <> struct dtype_of<bfloat16> { static constexpr dtype value = dtype::bfloat16; };
template <class T> inline constexpr dtype dtype_of_v = dtype_of<T>::value;

} // namespace troupe

template <> struct fmt::formatter<troupe::dtype> : fmt::formatter<std::string_view> {
  auto format(troupe::dtype t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(troupe::name_of(t), ctx);
  }
};
