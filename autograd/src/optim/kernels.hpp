#pragma once
// Element loops shared by the optimizers (private to src/optim). Updates
// are computed in double per element and stored in the parameter's dtype.
#include <cstdint>
#include <type_traits>

#include "troupe/tensor/parallel_for.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::optim::detail {

/// Calls fn(n, p, g, s0, s1, ...) with typed pointers into each contiguous
/// tensor, for T = float or double: once over all elements, or over ranges
/// of them on the intra-op threads (every element's update is independent).
template <class Fn, class... Tensors>
void for_floating(const tensor& parameter, Fn&& fn, const Tensors&... others) {
  auto split = [&](auto* p, auto*... rest) {
    troupe::detail::parallel_for(
        parameter.numel(), 16384,
        [&](std::int64_t begin, std::int64_t end) { fn(end - begin, p + begin, (rest + begin)...); }, 64);
  };
  if (parameter.type() == dtype::float32)
    split(parameter.data<float>(), others.template data<float>()...);
  else
    split(parameter.data<double>(), others.template data<double>()...);
}

/// Whether the update can run as a loop over host memory; parameters on
/// another device (CUDA) are updated with tensor ops on their device.
inline bool on_host(const tensor& parameter) {
  return parameter.where().kind == device_kind::cpu;
}

} // namespace troupe::optim::detail
