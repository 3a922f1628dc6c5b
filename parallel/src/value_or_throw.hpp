#pragma once
// The value of a collective's result inside autograd code, where an error
// can only leave as an exception (a layer's forward returns a variable):
// "<what>: <the collective's message>" as std::runtime_error.
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

template <class T> T value_or_throw(expected<T> result, const char* what) {
  if (!result)
    throw std::runtime_error(fmt::format("{}: {}", what, result.error().message()));
  if constexpr (!std::is_void_v<T>)
    return std::move(*result);
}

} // namespace troupe::parallel
