#pragma once
// Private (src/optim): the optimizers' updates written as whole-tensor ops,
// for parameters whose memory the host cannot loop over (CUDA). They
// compute what the element loops in adam.cpp and sgd.cpp compute, in the
// parameter's precision instead of in double per element;
// tests/autograd/optim_tensor_updates_test.cpp holds them to the loops on
// the CPU.
#include <cmath>
#include <cstdint>
#include <vector>

#include "troupe/autograd/optim/adam.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::optim::detail {

/// The scalars of one Adam step, shared by the loop and the tensor ops.
struct adam_step_scalars {
  double step_size = 0;             ///< lr / (1 - beta1^t)
  double bias_correction2_sqrt = 0; ///< sqrt(1 - beta2^t)
  double l2 = 0;                    ///< Adam's penalty added to the gradient
  double decay = 1;                 ///< AdamW's factor on the parameter
};

inline adam_step_scalars adam_scalars(const adam_options& o, bool decoupled, std::int64_t step) {
  const double t = static_cast<double>(step);
  return {o.lr / (1.0 - std::pow(o.beta1, t)), std::sqrt(1.0 - std::pow(o.beta2, t)),
          decoupled ? 0.0 : o.weight_decay, decoupled ? 1.0 - o.lr * o.weight_decay : 1.0};
}

/// Adam's update of `data` and its moments `m`, `v` (all on one device).
inline void adam_update_with_ops(const adam_options& o, const adam_step_scalars& s, tensor& data, const tensor& grad,
                                 tensor& m, tensor& v) {
  const auto gi = s.l2 != 0.0 ? add(grad, mul(data, s.l2)) : grad;
  m.copy_from(add(mul(m, o.beta1), mul(gi, 1.0 - o.beta1)));
  v.copy_from(add(mul(v, o.beta2), mul(mul(gi, gi), 1.0 - o.beta2)));
  const auto denominator = add(mul(sqrt(v), 1.0 / s.bias_correction2_sqrt), o.eps);
  data.copy_from(sub(mul(data, s.decay), mul(div(m, denominator), s.step_size)));
}

/// SGD's update of `data`; `state` holds the momentum buffer once made
/// (the first step with momentum makes it from the gradient).
inline void sgd_update_with_ops(const sgd_options& o, tensor& data, const tensor& grad, std::vector<tensor>& state) {
  const auto d = o.weight_decay != 0.0 ? add(grad, mul(data, o.weight_decay)) : grad;
  if (o.momentum == 0.0) {
    data.copy_from(sub(data, mul(d, o.lr)));
    return;
  }
  if (state.empty())
    state.push_back(d.clone());
  else
    state[0].copy_from(add(mul(state[0], o.momentum), mul(d, 1.0 - o.dampening)));
  const auto& b = state[0];
  data.copy_from(sub(data, mul(o.nesterov ? add(d, mul(b, o.momentum)) : b, o.lr)));
}

} // namespace troupe::optim::detail
