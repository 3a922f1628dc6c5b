#pragma once
// Strict `--name=value` parsing for the examples: a bad value is reported
// with the option's name, the value and the accepted range, never ignored.
#include <charconv>
#include <optional>
#include <set>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/tensor/expected.hpp"

namespace troupe::examples {

class command_line {
public:
  command_line(int argc, char** argv) : args_(argv + 1, argv + argc) {}

  /// Integer option in [low, high], or `fallback` when absent.
  expected<std::int64_t> integer(std::string_view name, std::int64_t fallback, std::int64_t low,
                                 std::int64_t high) {
    auto text = take(name);
    if (!text)
      return fallback;
    std::int64_t value = 0;
    auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
    if (ec != std::errc{} || end != text->data() + text->size() || value < low || value > high)
      return make_error(errc::invalid_argument, "--{} is '{}' but must be an integer in [{}, {}]", name,
                        *text, low, high);
    return value;
  }

  /// String option, or `fallback` when absent.
  std::string text(std::string_view name, std::string fallback) {
    auto value = take(name);
    return value ? *value : fallback;
  }

  /// Call after reading every option: an argument nobody asked for is an
  /// error (a typo must not silently run with defaults). `--troupe.*`
  /// arguments belong to the node (node_options::from) and are left alone.
  expected<void> finish() const {
    for (std::size_t i = 0; i < args_.size(); ++i)
      if (!used_.count(i) && !args_[i].starts_with("--troupe."))
        return make_error(errc::invalid_argument, "unknown argument '{}'", args_[i]);
    return {};
  }

private:
  std::optional<std::string> take(std::string_view name) {
    auto prefix = "--" + std::string(name) + "=";
    for (std::size_t i = 0; i < args_.size(); ++i) {
      if (std::string_view(args_[i]).starts_with(prefix)) {
        used_.insert(i);
        return args_[i].substr(prefix.size());
      }
    }
    return std::nullopt;
  }

  std::vector<std::string> args_;
  std::set<std::size_t> used_;
};

} // namespace troupe::examples
