// Training on a CUDA device equals training on the CPU: the same GPT (same
// seed, data and dropout stream) trained a few AdamW steps in both places
// gives the same losses and parameters within float rounding. Without a
// device the same tests run on an emulated one (host memory, the CPU's
// kernels; tests/support/emulated_device.hpp), saying so: that checks that
// every tensor of the model, its gradients, the optimizer's state and the
// random draws is made on the model's device, not CUDA.
#include <gtest/gtest.h>

#include "emulated_device.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/all.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {
namespace {

const device gpu = device::cuda(0);

struct run_result {
  std::vector<double> losses;
  named_tensors state; // on the CPU
};

/// Trains `steps` AdamW steps on `where` from the model's seed, drawing the
/// batches and the dropout masks from fixed streams.
run_result train_gpt(device where, dtype type, int steps) {
  gpt model(gpt_config{.vocab_size = 11,
                       .block_size = 16,
                       .n_layer = 2,
                       .n_head = 2,
                       .n_embd = 32,
                       .dropout = 0.1,
                       .type = type,
                       .seed = 3});
  model.to(where);
  optim::adamw opt(model.named_parameters(), optim::adam_options{.lr = 3e-3, .weight_decay = 0.01});
  generator data{21};
  default_generator() = generator{5};
  run_result result;
  for (int step = 0; step < steps; ++step) {
    auto ids = randint({4, 16}, data, 0, 11, where);
    auto targets = randint({4 * 16}, data, 0, 11, where);
    opt.zero_grad();
    auto logits = model(variable(ids));
    auto loss = autograd::cross_entropy(autograd::reshape(logits, {4 * 16, 11}), targets);
    autograd::backward(loss);
    opt.step();
    result.losses.push_back(loss.item());
  }
  for (auto& [name, value] : model.state_dict())
    result.state.emplace_back(name, value.to(device::cpu()));
  return result;
}

class CudaTraining : public ::testing::Test {
protected:
  test::cuda_or_emulated devices_{1};
};

void expect_same_training(dtype type, double loss_tolerance, double parameter_tolerance) {
  auto on_cpu = train_gpt(device::cpu(), type, 6);
  auto on_gpu = train_gpt(gpu, type, 6);
  ASSERT_EQ(on_gpu.losses.size(), on_cpu.losses.size());
  for (std::size_t i = 0; i < on_cpu.losses.size(); ++i)
    EXPECT_NEAR(on_gpu.losses[i], on_cpu.losses[i], loss_tolerance) << "step " << i;
  ASSERT_EQ(on_gpu.state.size(), on_cpu.state.size());
  for (std::size_t i = 0; i < on_cpu.state.size(); ++i) {
    EXPECT_EQ(on_gpu.state[i].first, on_cpu.state[i].first);
    EXPECT_LE(max_abs_diff(on_gpu.state[i].second, on_cpu.state[i].second), parameter_tolerance)
      << on_cpu.state[i].first;
  }
  // The model learned something: the comparison is not of two constant runs.
  EXPECT_NE(on_cpu.losses.front(), on_cpu.losses.back());
}

TEST_F(CudaTraining, GptWithDropoutTrainsAsOnTheCpuInFloat64) {
  expect_same_training(dtype::float64, 1e-9, 1e-8);
}

TEST_F(CudaTraining, GptWithDropoutTrainsAsOnTheCpuInFloat32) {
  expect_same_training(dtype::float32, 1e-4, 1e-3);
}

// The fused optimizer steps (cuda_optim.cu) against the CPU's element loops:
// SGD plain, with momentum and dampening, Nesterov; Adam with L2 decay.
TEST_F(CudaTraining, SgdAndAdamStepAsOnTheCpu) {
  const optim::sgd_options sgd_variants[] = {
    {.lr = 0.1, .weight_decay = 0.01},
    {.lr = 0.1, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.01},
    {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true},
  };
  for (int variant = 0; variant < 4; ++variant) {
    std::vector<tensor> weights;
    for (auto where : {device::cpu(), gpu}) {
      linear model(linear_options{.in_features = 3, .out_features = 2, .type = dtype::float64, .seed = 4});
      model.to(where);
      std::unique_ptr<optim::optimizer> opt;
      if (variant < 3)
        opt = std::make_unique<optim::sgd>(model.named_parameters(), sgd_variants[variant]);
      else
        opt = std::make_unique<optim::adam>(model.named_parameters(),
                                            optim::adam_options{.lr = 0.01, .weight_decay = 0.1});
      generator data{8};
      for (int step = 0; step < 5; ++step) {
        auto x = randn({8, 3}, data, 0.0, 1.0, dtype::float64, where);
        opt->zero_grad();
        autograd::backward(autograd::mse_loss(model(variable(x)), variable(tensor::zeros({8, 2}, dtype::float64, where))));
        opt->step();
      }
      weights.push_back(model.weight().data().to(device::cpu()));
    }
    EXPECT_LE(max_abs_diff(weights[1], weights[0]), 1e-12) << "variant " << variant;
    EXPECT_GT(max_abs_diff(weights[0], linear(linear_options{.in_features = 3, .out_features = 2,
                                                             .type = dtype::float64, .seed = 4})
                                         .weight()
                                         .data()),
              1e-4)
      << "the weights moved, variant " << variant;
  }
}

TEST(CudaTrainingWithoutDevice, MovingAModuleToAMissingDeviceIsAUsageError) {
  if (cuda_device_count() > 0)
    GTEST_SKIP() << "this machine has " << cuda_device_count() << " CUDA device(s)";
  linear model(2, 2, 1);
  EXPECT_THROW(model.to(gpu), usage_error);
  // Nothing moved: the parameters still live on the CPU and train there.
  EXPECT_EQ(model.weight().data().where(), device::cpu());
}

} // namespace
} // namespace troupe::nn
