#pragma once
// Element loops shared by the optimizers (private to src/optim). Updates
// are computed in double per element and stored in the parameter's dtype.
#include <cstdint>
#include <type_traits>

#include "troupe/tensor/tensor.hpp"

namespace troupe::optim::detail {

/// Calls fn(p, g, s0, s1, ...) with typed pointers to the first element of
/// each contiguous tensor and the element count, for T = float or double.
template <class Fn, class... Tensors>
void for_floating(const tensor& parameter, Fn&& fn, const Tensors&... others) {
  if (parameter.type() == dtype::float32)
    fn(parameter.numel(), parameter.data<float>(), others.template data<float>()...);
  else
    fn(parameter.numel(), parameter.data<double>(), others.template data<double>()...);
}

/// Whether the update can run as a loop over host memory; parameters on
/// another device (CUDA) are updated with tensor ops on their device.
inline bool on_host(const tensor& parameter) {
  return parameter.where().kind == device_kind::cpu;
}

} // namespace troupe::optim::detail
