// The backend's default optimizer steps (backend::adam_step and sgd_step as
// whole-tensor ops, which a device without fused kernels runs) against the
// element loops that the CPU backend overrides them with: both are run here, on the CPU, for
// several steps of Adam, AdamW and SGD (plain, momentum, Nesterov, weight
// decay), and must give the same parameters within float64 rounding. The
// scalars of each step are computed here from the formulas, independently
// of adam.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "troupe/autograd/optim/all.hpp"
#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/ops.hpp"

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
    for (int k = 0; k < 4; ++k) {
      const double t = k + 1;
      const adam_step_args step{o.beta1,
                                o.beta2,
                                o.eps,
                                o.lr / (1.0 - std::pow(o.beta1, t)),
                                std::sqrt(1.0 - std::pow(o.beta2, t)),
                                decoupled ? 0.0 : o.weight_decay,
                                decoupled ? 1.0 - o.lr * o.weight_decay : 1.0};
      // The base class's whole-tensor ops, not the CPU backend's own pass.
      backend_for(data.where()).backend::adam_step(data, sample(100 + static_cast<std::uint64_t>(k)), m, v, step);
    }
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
    tensor buffer = o.momentum != 0.0 ? tensor::zeros(data.shape(), dtype::float64) : tensor{};
    for (int k = 0; k < 4; ++k)
      backend_for(data.where())
        .backend::sgd_step(data, sample(100 + static_cast<std::uint64_t>(k)), buffer,
                  sgd_step_args{o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, k == 0});
    EXPECT_LE(max_abs_diff(data, p.data()), 1e-14)
      << "momentum " << o.momentum << " nesterov " << o.nesterov << " decay " << o.weight_decay;
  }
}

TEST(OptimTensorUpdates, TheCpuStepsRefuseOperandsUnlikeTheParameter) {
  auto& cpu = backend_for(device{});
  auto param = sample(3);
  auto m = tensor::zeros(param.shape(), dtype::float64);
  auto v = tensor::zeros(param.shape(), dtype::float64);
  const auto refusal = [](const std::function<void()>& step) {
    try {
      step();
    } catch (const usage_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const adam_step_args adam{.step_size = 0.01};
  EXPECT_NE(refusal([&] { cpu.adam_step(param, sample(4).t(), m, v, adam); }).find("contiguous"), std::string::npos)
    << "a transposed gradient";
  EXPECT_NE(refusal([&] { cpu.adam_step(param, sample(4).to(dtype::float32), m, v, adam); }).find("float64"),
            std::string::npos)
    << "a gradient of another dtype";
  auto short_buffer = tensor::zeros({3}, dtype::float64);
  EXPECT_NE(refusal([&] { cpu.sgd_step(param, sample(4), short_buffer, sgd_step_args{.lr = 0.1, .momentum = 0.9}); })
              .find("35 elements"),
            std::string::npos)
    << "a momentum buffer of another size";
  EXPECT_TRUE(troupe::allclose(param, sample(3), 0.0, 0.0)) << "a refused step changes nothing";
}

} // namespace
} // namespace troupe::optim
