// End to end: small models learn with modules, losses and optimizers.
#include <gtest/gtest.h>

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/all.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {
namespace {

TEST(NnTraining, MlpLearnsXor) {
  auto model = make<sequential>(std::initializer_list<module_ptr>{make<linear>(2, 16, 1), make<relu>(),
                                                                  make<linear>(16, 1, 1)});
  model->reset_parameters(3);
  optim::adam opt(model->named_parameters(), optim::adam_options{.lr = 0.05});
  auto x = variable(tensor::from<float>({0, 0, 0, 1, 1, 0, 1, 1}, {4, 2}));
  auto y = variable(tensor::from<float>({0, 1, 1, 0}, {4, 1}));
  double loss_value = 1.0;
  for (int step = 0; step < 300 && loss_value > 1e-3; ++step) {
    opt.zero_grad();
    auto loss = autograd::mse_loss((*model)(x), y);
    autograd::backward(loss);
    opt.step();
    loss_value = loss.item();
  }
  EXPECT_LT(loss_value, 1e-2);
}

TEST(NnTraining, SgdFitsALinearRegression) {
  generator gen{5};
  auto inputs = randn({64, 3}, gen);
  auto true_weight = tensor::from<float>({1.5f, -2.0f, 0.5f}, {3, 1});
  auto targets = add(matmul(inputs, true_weight), 0.25);
  linear model(3, 1, 7);
  optim::sgd opt(model.named_parameters(), optim::sgd_options{.lr = 0.1, .momentum = 0.9});
  double loss_value = 1.0;
  for (int step = 0; step < 200; ++step) {
    opt.zero_grad();
    auto loss = autograd::mse_loss(model(variable(inputs)), variable(targets));
    autograd::backward(loss);
    opt.step();
    loss_value = loss.item();
  }
  EXPECT_LT(loss_value, 1e-6);
  EXPECT_NEAR(model.bias().data().item(), 0.25, 1e-3);
  EXPECT_NEAR(model.weight().data().at({0, 1}), -2.0, 1e-3);
}

TEST(NnTraining, TinyGptLowersItsLoss) {
  gpt model(gpt_config{.vocab_size = 5, .block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 16, .seed = 2});
  optim::adamw opt(model.named_parameters(), optim::adam_options{.lr = 1e-2, .weight_decay = 0.0});
  // A repeating sequence 0 1 2 3 4 0 1 2 3: the next token is predictable.
  std::vector<std::int64_t> sequence{0, 1, 2, 3, 4, 0, 1, 2, 3};
  auto inputs = tensor::from(std::vector<std::int64_t>(sequence.begin(), sequence.end() - 1), {1, 8});
  auto targets = tensor::from(std::vector<std::int64_t>(sequence.begin() + 1, sequence.end()), {8});
  double first = 0.0, last = 0.0;
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    auto logits = model(variable(inputs));
    auto loss = autograd::cross_entropy(autograd::reshape(logits, {8, 5}), targets);
    autograd::backward(loss);
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, 0.1 * first);
}

} // namespace
} // namespace troupe::nn
