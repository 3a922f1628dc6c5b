// The optimizers' whole-tensor updates (autograd/src/optim/tensor_updates.hpp),
// which run on devices the host cannot loop over (CUDA), against the element
// loops that run on the CPU: both are run here, on the CPU, for several
// steps of Adam, AdamW and SGD (plain, momentum, Nesterov, weight decay),
// and must give the same parameters and state within float64 rounding.
#include <gtest/gtest.h>

#include "tensor_updates.hpp"
#include "troupe/autograd/optim/all.hpp"

namespace troupe::optim {
namespace {

tensor sample(std::uint64_t seed) {
  generator gen{seed};
  return randn({5, 7}, gen, 0.0, 1.0, dtype::float64);
}

/// Runs `steps` updates of `opt` over `p` with gradients sample(100 + k).
void run_loop(optimizer& opt, autograd::variable& p, int steps) {
  for (int k = 0; k < steps; ++k) {
    p.set_grad(sample(100 + static_cast<std::uint64_t>(k)));
    opt.step();
  }
}

TEST(OptimTensorUpdates, AdamAndAdamwEqualTheElementLoops) {
  for (bool decoupled : {false, true}) {
    const adam_options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
    autograd::variable p(sample(1), true);
    std::unique_ptr<optimizer> opt;
    if (decoupled)
      opt = std::make_unique<adamw>(named_variables{{"p", p}}, o);
    else
      opt = std::make_unique<adam>(named_variables{{"p", p}}, o);
    run_loop(*opt, p, 4);

    auto data = sample(1);
    auto m = tensor::zeros(data.shape(), dtype::float64);
    auto v = tensor::zeros(data.shape(), dtype::float64);
    for (int k = 0; k < 4; ++k)
      detail::adam_update_with_ops(o, detail::adam_scalars(o, decoupled, k + 1), data, sample(100 + k), m, v);
    EXPECT_LE(max_abs_diff(data, p.data()), 1e-14) << (decoupled ? "adamw" : "adam");
    EXPECT_GT(max_abs_diff(data, sample(1)), 1e-3) << "the parameters moved";
  }
}

TEST(OptimTensorUpdates, SgdEqualsTheElementLoops) {
  const sgd_options variants[] = {
    {.lr = 0.1},
    {.lr = 0.1, .weight_decay = 0.05},
    {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.05},
    {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.05, .nesterov = true},
  };
  for (const auto& o : variants) {
    autograd::variable p(sample(2), true);
    sgd opt(named_variables{{"p", p}}, o);
    run_loop(opt, p, 4);

    auto data = sample(2);
    std::vector<tensor> state;
    for (int k = 0; k < 4; ++k)
      detail::sgd_update_with_ops(o, data, sample(100 + k), state);
    EXPECT_LE(max_abs_diff(data, p.data()), 1e-14)
      << "momentum " << o.momentum << " nesterov " << o.nesterov << " decay " << o.weight_decay;
  }
}

} // namespace
} // namespace troupe::optim
