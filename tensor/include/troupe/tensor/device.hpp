#pragma once
// Where a tensor's memory lives: `cpu` or `cuda:N`.
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "troupe/tensor/fwd.hpp"

namespace troupe {

enum class device_kind : std::uint8_t { cpu = 0, cuda = 1 };

/// A device: its kind and, for CUDA, the ordinal. Every tensor carries one;
/// kernels are looked up per device in the backend table (backend.hpp), so a
/// CUDA backend slots in without changing callers.
struct device {
  device_kind kind = device_kind::cpu;
  std::int32_t index = 0;

  static constexpr device cpu() { return {device_kind::cpu, 0}; }
  static constexpr device cuda(std::int32_t ordinal) { return {device_kind::cuda, ordinal}; }

  /// Parses `cpu` or `cuda:N`; nullopt for anything else.
  static std::optional<device> parse(std::string_view text);

  std::string to_string() const;
  friend auto operator<=>(const device&, const device&) = default;
};

} // namespace troupe

template <> struct fmt::formatter<troupe::device> : fmt::formatter<std::string_view> {
  auto format(const troupe::device& d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.to_string(), ctx);
  }
};
