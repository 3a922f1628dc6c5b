#pragma once
// Tier-3 errors (docs/style.md): failures caused by input from outside the process
// (network bytes, files, configuration) are values, never exceptions.
//
// docs/style.md asks for caf::expected, but docs/design.md forbids tensor/, autograd/
// and serialization/ from knowing CAF. So the lower modules use this small
// equivalent and actors/ maps `errc` onto a CAF error category.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "troupe/tensor/error.hpp"

namespace troupe {

/// Why an outside input was rejected. Values are stable (logged, and mapped
/// onto CAF's error category by actors/).
enum class errc : std::uint8_t {
  malformed_message = 1, ///< bytes that do not parse or fail validation
  unsupported_dtype = 2,
  size_limit_exceeded = 3, ///< a count or size beyond a configured bound
  checksum_mismatch = 4,
  io_error = 5,           ///< the OS refused a read or write
  state_mismatch = 6,     ///< a checkpoint does not fit the model/optimizer
  invalid_argument = 7,   ///< configuration or command-line value
};

std::string_view name_of(errc code);

/// An error code plus a message naming what was wrong and the offending
/// values ("dimension 2 is -5 but must be in [0, 2^40]").
class error {
public:
  error(errc code, std::string message) : code_(code), message_(std::move(message)) {}
  errc code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  /// "malformed_message: ..." for logs.
  std::string to_string() const;
  friend bool operator==(const error& a, const error& b) { return a.code_ == b.code_; }

private:
  errc code_;
  std::string message_;
};

template <class... Ts>
error make_error(errc code, fmt::format_string<Ts...> format, Ts&&... args) {
  return error(code, fmt::format(format, std::forward<Ts>(args)...));
}

/// A value or an error (std::expected is C++23; g++ 12 with C++20 lacks it).
template <class T> class expected {
public:
  expected(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  expected(troupe::error err) : state_(std::in_place_index<1>, std::move(err)) {}

  bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & {
    TROUPE_ASSERT(has_value(), "expected::value on an error: {}", std::get<1>(state_).to_string());
    return std::get<0>(state_);
  }
  const T& value() const& {
    TROUPE_ASSERT(has_value(), "expected::value on an error: {}", std::get<1>(state_).to_string());
    return std::get<0>(state_);
  }
  T&& value() && {
    TROUPE_ASSERT(has_value(), "expected::value on an error: {}", std::get<1>(state_).to_string());
    return std::get<0>(std::move(state_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const troupe::error& error_value() const {
    TROUPE_ASSERT(!has_value(), "expected::error on a value");
    return std::get<1>(state_);
  }
  /// Same as error_value(), named like caf::expected.
  const troupe::error& error() const { return error_value(); }

private:
  std::variant<T, troupe::error> state_;
};

/// expected<void>: success or an error.
template <> class expected<void> {
public:
  expected() = default;
  expected(troupe::error err) : error_(std::move(err)), failed_(true) {}
  bool has_value() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return has_value(); }
  const troupe::error& error_value() const {
    TROUPE_ASSERT(failed_, "expected::error on a value");
    return error_;
  }
  const troupe::error& error() const { return error_value(); }

private:
  troupe::error error_{errc::malformed_message, {}};
  bool failed_ = false;
};

} // namespace troupe
