// Training on a CUDA device equals training on the CPU: the same GPT (same
// seed, data and dropout stream) trained a few AdamW steps in both places
// gives the same losses and parameters within float rounding. Without a
// device the same tests run on an emulated one (host memory, the CPU's
// kernels; tests/support/emulated_device.hpp), saying so: that checks that
// every tensor of the model, its gradients, the optimizer's state and the
// random draws is made on the model's device, not CUDA.
#include <cstdio>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cuda_device_under_test.hpp"
#include "emulated_device.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/all.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {
namespace {

const device gpu = test::cuda_device_under_test();

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
  void SetUp() override {
    if (devices_.ordinals() <= gpu.index)
      GTEST_SKIP() << "the cases are to run on " << gpu.to_string() << ", this machine has " << devices_.ordinals()
                   << " CUDA device(s)";
  }

  test::cuda_or_emulated devices_{gpu.index + 1};
};

void expect_same_results(const run_result& on_gpu, const run_result& on_cpu, double loss_tolerance,
                         double parameter_tolerance) {
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

void expect_same_training(dtype type, double loss_tolerance, double parameter_tolerance) {
  expect_same_results(train_gpt(gpu, type, 6), train_gpt(device::cpu(), type, 6), loss_tolerance,
                      parameter_tolerance);
}

TEST_F(CudaTraining, GptWithDropoutTrainsAsOnTheCpuInFloat64) {
  expect_same_training(dtype::float64, 1e-9, 1e-8);
}

TEST_F(CudaTraining, GptWithDropoutTrainsAsOnTheCpuInFloat32) {
  expect_same_training(dtype::float32, 1e-4, 1e-3);
}

/// Trains a small convolutional network (two convolutions, one strided, a
/// max pool between them, a linear classifier) `steps` SGD steps with
/// momentum on `where`: on a GPU its convolutions run in cuDNN where this
/// build and machine have it (troupe::cuda_convolution() says).
run_result train_convnet(device where, dtype type, int steps) {
  auto features = std::make_shared<sequential>(std::initializer_list<module_ptr>{
    std::make_shared<conv2d>(conv2d_options{.in_channels = 3, .out_channels = 8, .kernel_size = 3, .padding = 1,
                                            .type = type, .seed = 11}),
    std::make_shared<relu>(), std::make_shared<max_pool2d>(pool2d_options{2, 2}),
    std::make_shared<conv2d>(conv2d_options{.in_channels = 8, .out_channels = 16, .kernel_size = 3, .stride = 2,
                                            .type = type, .seed = 12}),
    std::make_shared<relu>()});
  linear classifier(linear_options{.in_features = 16 * 3 * 3, .out_features = 5, .type = type, .seed = 13});
  features->to(where);
  classifier.to(where);
  auto parameters = features->named_parameters();
  for (auto& named : classifier.named_parameters())
    parameters.push_back(named);
  optim::sgd opt(parameters, optim::sgd_options{.lr = 0.05, .momentum = 0.9});
  generator data{31};
  run_result result;
  for (int step = 0; step < steps; ++step) {
    auto images = randn({6, 3, 14, 14}, data, 0.0, 1.0, type, where);
    auto labels = randint({6}, data, 0, 5, where);
    opt.zero_grad();
    auto maps = (*features)(variable(images));
    auto loss = autograd::cross_entropy(classifier(autograd::reshape(maps, {6, 16 * 3 * 3})), labels);
    autograd::backward(loss);
    opt.step();
    result.losses.push_back(loss.item());
  }
  for (auto& [name, value] : features->state_dict())
    result.state.emplace_back(name, value.to(device::cpu()));
  for (auto& [name, value] : classifier.state_dict())
    result.state.emplace_back("classifier." + name, value.to(device::cpu()));
  return result;
}

TEST_F(CudaTraining, ConvolutionalNetworkTrainsAsOnTheCpu) {
  if (cuda_device_count() > 0)
    std::printf("conv2d on CUDA: %s\n", cuda_convolution().c_str());
  for (auto [type, loss_tolerance, parameter_tolerance] :
       {std::tuple{dtype::float64, 1e-10, 1e-10}, std::tuple{dtype::float32, 1e-4, 1e-4}}) {
    SCOPED_TRACE(fmt::format("{}", type));
    expect_same_results(train_convnet(gpu, type, 4), train_convnet(device::cpu(), type, 4), loss_tolerance,
                        parameter_tolerance);
  }
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
