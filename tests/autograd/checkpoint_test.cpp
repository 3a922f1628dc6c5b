// Recomputation gives the gradients of the plain run, dropout included.
#include <gtest/gtest.h>

#include "gradcheck.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/checkpoint.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/node.hpp"

namespace troupe::autograd {
namespace {

struct block {
  variable w1, b1, w2, b2;

  explicit block(dtype type) {
    generator gen{5, 0};
    w1 = variable(randn({8, 4}, gen, 0, 0.5, type), true);
    b1 = variable(randn({8}, gen, 0, 0.5, type), true);
    w2 = variable(randn({3, 8}, gen, 0, 0.5, type), true);
    b2 = variable(randn({3}, gen, 0, 0.5, type), true);
  }
  std::vector<variable> params() const { return {w1, b1, w2, b2}; }
  void zero_grads() {
    for (auto p : params())
      p.zero_grad();
  }
  /// linear -> gelu -> dropout -> linear
  checkpoint_function fn() const {
    return [w1 = w1, b1 = b1, w2 = w2, b2 = b2](const std::vector<variable>& in) {
      auto h = dropout(gelu(linear(in[0], w1, b1)), 0.3, true);
      return std::vector<variable>{linear(h, w2, b2)};
    };
  }
};

std::vector<float> values(const tensor& t) { return t.to_vector<float>(); }

TEST(Checkpoint, GradientsEqualThePlainRunWithDropout) {
  block net(dtype::float32);
  generator gen{6, 0};
  auto x0 = randn({5, 4}, gen);
  auto target = randn({5, 3}, gen);

  variable x_plain(x0, true);
  default_generator() = generator{77, 0};
  auto out_plain = net.fn()({x_plain})[0];
  auto after_forward = default_generator();
  backward(mse_loss(out_plain, variable(target)));
  std::vector<tensor> plain;
  for (const auto& p : net.params())
    plain.push_back(p.grad().clone());
  net.zero_grads();

  variable x_ckpt(x0, true);
  default_generator() = generator{77, 0};
  auto out_ckpt = checkpoint(net.fn(), {x_ckpt})[0];
  EXPECT_EQ(out_ckpt.grad_fn()->name(), "checkpoint_backward");
  EXPECT_EQ(values(out_ckpt.data()), values(out_plain.data()));
  EXPECT_EQ(default_generator().offset, after_forward.offset);
  backward(mse_loss(out_ckpt, variable(target)));
  // Recomputation leaves the generator where the forward left it.
  EXPECT_EQ(default_generator().offset, after_forward.offset);
  EXPECT_EQ(default_generator().seed, after_forward.seed);

  EXPECT_EQ(values(x_ckpt.grad()), values(x_plain.grad()));
  auto params = net.params();
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(values(params[i].grad()), values(plain[i])) << "parameter " << i;
}

TEST(Checkpoint, ParametersInsideFireHooksOnceAndOutputsRequireGrad) {
  block net(dtype::float32);
  int calls = 0;
  for (auto p : net.params())
    p.add_grad_ready_hook([&](variable&) { ++calls; });
  generator gen{8, 0};
  variable x(randn({2, 4}, gen)); // input needs no gradient; parameters do
  auto out = checkpoint(net.fn(), {x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].requires_grad());
  backward(sum(out[0]));
  EXPECT_EQ(calls, 4);
  for (auto p : net.params())
    EXPECT_TRUE(p.grad().defined());
}

TEST(Checkpoint, UnderNoGradItJustRuns) {
  block net(dtype::float32);
  generator gen{9, 0};
  variable x(randn({2, 4}, gen), true);
  no_grad_guard guard;
  auto out = checkpoint(net.fn(), {x});
  EXPECT_EQ(out[0].grad_fn(), nullptr);
}

TEST(Checkpoint, GradDoesNotTouchParameters) {
  block net(dtype::float64);
  variable x(testing::random_tensor({2, 4}, 10), true);
  default_generator() = generator{3, 0};
  auto out = checkpoint(net.fn(), {x})[0];
  auto g = tensor::ones(out.shape(), dtype::float64);
  std::vector<variable> outputs{out}, inputs{x};
  std::vector<tensor> grads{g};
  auto dx = grad(outputs, grads, inputs);
  ASSERT_TRUE(dx[0].defined());
  EXPECT_FALSE(x.grad().defined());
  for (auto p : net.params())
    EXPECT_FALSE(p.grad().defined());
}

TEST(Checkpoint, MatchesFiniteDifferences) {
  block net(dtype::float64);
  auto fn = net.fn();
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<variable>& v) {
        default_generator() = generator{4, 0};
        return checkpoint(fn, v)[0];
      },
      {testing::random_tensor({3, 4}, 11)}));
}

TEST(Checkpoint, SecondBackwardWithoutRetainGraphIsAnError) {
  block net(dtype::float32);
  generator gen{12, 0};
  variable x(randn({2, 4}, gen), true);
  auto out = checkpoint(net.fn(), {x})[0];
  auto loss = sum(out);
  backward(loss, {.retain_graph = true});
  backward(loss, {.retain_graph = true});
  backward(loss);
  EXPECT_THROW(backward(loss), usage_error);
}

} // namespace
} // namespace troupe::autograd
