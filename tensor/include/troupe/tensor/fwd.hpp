#pragma once
// Forward declarations for the tensor module.
#include <cstdint>
#include <vector>

namespace troupe {

enum class dtype : std::uint8_t;
struct device;
class storage;
class tensor;
struct pending_host_copy;
class backend;
struct generator;
class usage_error;

/// Sizes or strides of a tensor, in elements.
using dims = std::vector<std::int64_t>;

} // namespace troupe
