#include "troupe/tensor/device.hpp"

#include <charconv>

namespace troupe {

std::optional<device> device::parse(std::string_view text) {
  if (text == "cpu")
    return device::cpu();
  constexpr std::string_view cuda_prefix = "cuda:";
  if (!text.starts_with(cuda_prefix))
    return std::nullopt;
  auto digits = text.substr(cuda_prefix.size());
  std::int32_t ordinal = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), ordinal);
  if (ec != std::errc{} || end != digits.data() + digits.size() || ordinal < 0 || digits.empty())
    return std::nullopt;
  return device::cuda(ordinal);
}

std::string device::to_string() const {
  if (kind == device_kind::cpu)
    return "cpu";
  return fmt::format("cuda:{}", index);
}

} // namespace troupe
