#include "troupe/command_line.hpp"

#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "troupe/tensor/cuda.hpp"

namespace troupe {

command_line::command_line(int argc, const char* const* argv) {
  if (argc > 0 && argv[0] != nullptr) {
    std::string_view path = argv[0];
    program_ = std::string(path.substr(path.find_last_of('/') + 1));
  }
  for (int i = 1; i < argc; ++i)
    args_.emplace_back(argv[i]);
}

const std::string* command_line::take(std::string_view name) {
  const auto prefix = "--" + std::string(name) + "=";
  for (std::size_t i = 0; i < args_.size(); ++i)
    if (args_[i].starts_with(prefix)) {
      used_.insert(i);
      return &args_[i];
    }
  return nullptr;
}

namespace {
std::string_view value_of(const std::string& argument) {
  return std::string_view(argument).substr(argument.find('=') + 1);
}
} // namespace

std::int64_t command_line::integer(std::string_view name, std::int64_t fallback, std::int64_t low,
                                   std::int64_t high) {
  const auto* argument = take(name);
  if (argument == nullptr)
    return fallback;
  const auto text = value_of(*argument);
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || value < low || value > high) {
    reject(fmt::format("--{} is '{}' but must be an integer in [{}, {}]", name, text, low, high));
    return fallback;
  }
  return value;
}

double command_line::number(std::string_view name, double fallback, double low, double high) {
  const auto* argument = take(name);
  if (argument == nullptr)
    return fallback;
  const auto text = value_of(*argument);
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(value) || value < low ||
      value > high) {
    reject(fmt::format("--{} is '{}' but must be a number in [{}, {}]", name, text, low, high));
    return fallback;
  }
  return value;
}

std::string command_line::choice(std::string_view name, std::string fallback,
                                 const std::vector<std::string>& allowed) {
  const auto* argument = take(name);
  if (argument == nullptr)
    return fallback;
  const auto text = value_of(*argument);
  for (const auto& a : allowed)
    if (text == a)
      return a;
  reject(fmt::format("--{} is '{}' but must be one of {}", name, text, fmt::join(allowed, ", ")));
  return fallback;
}

std::string command_line::text(std::string_view name, std::string fallback) {
  const auto* argument = take(name);
  return argument == nullptr ? fallback : std::string(value_of(*argument));
}

troupe::device command_line::device_here(std::string_view name, troupe::device fallback) {
  const auto* argument = take(name);
  if (argument == nullptr)
    return fallback;
  const auto text = value_of(*argument);
  const auto parsed = troupe::device::parse(text);
  if (!parsed) {
    reject(fmt::format("--{} is '{}' but must be cpu or cuda:N", name, text));
    return fallback;
  }
  if (parsed->kind != device_kind::cuda)
    return *parsed; // asks nothing of CUDA (a CPU run never starts its runtime here)
  if (const auto count = cuda_device_count(); parsed->index >= count) {
    reject(count == 0 ? fmt::format("--{} is '{}' but this machine has no CUDA device ({})", name, text,
                                    cuda_unavailable_reason())
                      : fmt::format("--{} is '{}' but this machine has cuda:0 to cuda:{}", name, text, count - 1));
    return fallback;
  }
  return *parsed;
}

std::vector<std::int64_t> command_line::integers(std::string_view name, std::vector<std::int64_t> fallback) {
  const auto* argument = take(name);
  if (argument == nullptr)
    return fallback;
  const auto text = value_of(*argument);
  std::vector<std::int64_t> values;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const auto end = std::min(text.find(',', begin), text.size());
    const auto item = text.substr(begin, end - begin);
    std::int64_t value = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec != std::errc{} || ptr != item.data() + item.size() || value <= 0) {
      reject(fmt::format("--{}: '{}' is not a positive integer (expected a list such as 1,2,4)", name, item));
      return fallback;
    }
    values.push_back(value);
    begin = end + 1;
  }
  return values;
}

bool command_line::has(std::string_view name) {
  const auto flag = "--" + std::string(name);
  for (std::size_t i = 0; i < args_.size(); ++i)
    if (args_[i] == flag) {
      used_.insert(i);
      return true;
    }
  return false;
}

void command_line::reject(std::string message) {
  errors_.push_back(std::move(message));
}

expected<void> command_line::finish() {
  auto errors = errors_;
  for (std::size_t i = 0; i < args_.size(); ++i)
    if (!used_.count(i) && !args_[i].starts_with("--troupe."))
      errors.push_back(fmt::format("unknown argument '{}'", args_[i]));
  if (!errors.empty())
    return make_error(errc::invalid_argument, "{}", fmt::join(errors, "; "));
  return {};
}

} // namespace troupe
