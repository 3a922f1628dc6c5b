#pragma once
// Init rules shared by the layers (private to src/nn).
#include <cmath>
#include <cstdint>

#include "troupe/tensor/ops.hpp"

namespace troupe::nn::detail {

/// Uniform in [-bound, bound) with bound = 1/sqrt(fan_in): PyTorch's
/// kaiming_uniform_(a = sqrt(5)) for weights and its bias rule.
inline void init_fan_in_uniform(tensor& data, std::int64_t fan_in, generator& gen) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  data.copy_from(troupe::rand(data.shape(), gen, -bound, bound, data.type(), data.where()));
}

inline void init_normal(tensor& data, double stddev, generator& gen) {
  data.copy_from(troupe::randn(data.shape(), gen, 0.0, stddev, data.type(), data.where()));
}

} // namespace troupe::nn::detail
