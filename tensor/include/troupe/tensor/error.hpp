#pragma once
// Tier-2 errors (docs/style.md): misuse of the in-process math API.
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace troupe {

/// Thrown when the math API is called with mismatched shapes, dtypes or
/// devices. The message names the op and the offending values, for example
/// `matmul: inner dimensions differ: [4, 3] x [5, 2]`.
class usage_error : public std::logic_error {
public:
  using std::logic_error::logic_error;
};

/// Throws usage_error with a formatted message unless `condition` holds.
template <class... Ts>
void require(bool condition, fmt::format_string<Ts...> format, Ts&&... args) {
  if (!condition)
    throw usage_error(fmt::format(format, std::forward<Ts>(args)...));
}

} // namespace troupe

/// Tier-1 errors: a bug in troupe itself. Aborts with file, line and message.
#define TROUPE_ASSERT(cond, ...)                                                          \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      ::fmt::print(stderr, "{}:{}: assertion `{}` failed: {}\n", __FILE__, __LINE__, #cond, \
                   ::fmt::format(__VA_ARGS__));                                           \
      std::abort();                                                                       \
    }                                                                                     \
  } while (false)
