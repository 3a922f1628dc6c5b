// The backward engine: accumulation, roots with given gradients, hooks,
// retain_graph, grad(), no_grad and error messages.
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "gradcheck.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/node.hpp"

namespace troupe::autograd {
namespace {

using testing::random_tensor;

void backward_from(const variable& root, const tensor& g, backward_options options = {}) {
  backward(std::span<const variable>(&root, 1), std::span<const tensor>(&g, 1), options);
}

std::vector<double> values(const tensor& t) { return t.to_vector<double>(); }

template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const usage_error& e) {
    return e.what();
  }
  return "no usage_error";
}

TEST(Backward, GradientsAccumulateAcrossTwoBackwards) {
  variable x(tensor::from<double>({1.0, -2.0, 3.0}, {3}), true);
  backward(sum(x * x));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2.0, -4.0, 6.0}));
  const void* storage_before = x.grad().raw_data();
  backward(sum(x * x));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{4.0, -8.0, 12.0}));
  // Accumulation is in place: optimizers and gradient buckets keep their view.
  EXPECT_EQ(x.grad().raw_data(), storage_before);
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Backward, FirstGradientIsAFreshCopy) {
  variable x(tensor::zeros({2, 2}, dtype::float64), true);
  auto g = random_tensor({2, 2}, 1);
  backward_from(x, g); // a leaf as root
  EXPECT_EQ(values(x.grad()), values(g));
  EXPECT_FALSE(x.grad().shares_storage_with(g));
  g.fill(7.0);
  EXPECT_NE(values(x.grad()), values(g));
}

TEST(Backward, NonScalarRootEqualsBackwardOfWeightedSum) {
  auto x0 = random_tensor({3, 4}, 2);
  auto w0 = random_tensor({4, 2}, 3);
  auto g = random_tensor({3, 2}, 4);
  variable x1(x0, true), w1(w0, true), x2(x0, true), w2(w0, true);
  backward_from(tanh(matmul(x1, w1)), g);
  backward(sum(tanh(matmul(x2, w2)) * variable(g)));
  EXPECT_LT(max_abs_diff(x1.grad(), x2.grad()), 1e-14);
  EXPECT_LT(max_abs_diff(w1.grad(), w2.grad()), 1e-14);
}

TEST(Backward, SameVariableUsedSeveralTimes) {
  variable x(tensor::from<double>({0.5, 2.0}, {2}), true);
  backward(sum(x * x + x + exp(x) * x));
  auto v = values(x.grad());
  for (int i = 0; i < 2; ++i) {
    double xi = i == 0 ? 0.5 : 2.0;
    EXPECT_NEAR(v[static_cast<std::size_t>(i)], 2 * xi + 1 + std::exp(xi) * (xi + 1), 1e-12);
  }
}

TEST(Backward, SeveralRootsAndUndefinedRootGradient) {
  variable x(random_tensor({3}, 5), true);
  auto y1 = x * 2.0;
  auto y2 = exp(x);
  auto g = tensor::ones({3}, dtype::float64);
  std::vector<variable> roots{y1, y2};
  std::vector<tensor> grads{g, tensor()}; // y2 contributes nothing
  backward(roots, grads);
  EXPECT_EQ(values(x.grad()), (std::vector<double>{2.0, 2.0, 2.0}));
}

TEST(Backward, UnusedSplitPieceGetsZeroGradient) {
  variable x(random_tensor({4}, 6), true);
  auto pieces = split(x, 2, 0);
  backward(sum(pieces[1]));
  EXPECT_EQ(values(x.grad()), (std::vector<double>{0.0, 0.0, 1.0, 1.0}));
}

TEST(Backward, HookFiresOncePerPassAfterAllContributions) {
  variable w(tensor::from<double>({1.0, 2.0}, {2}), true);
  w.set_name("w");
  int calls = 0;
  std::vector<double> seen;
  w.add_grad_ready_hook([&](variable& v) {
    ++calls;
    EXPECT_TRUE(v.same(w));
    seen = values(v.grad());
  });
  // w is used twice, far apart in the graph.
  auto h = tanh(w * 3.0);
  auto loss = sum(h * w);
  backward(loss);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, values(w.grad()));
  backward(sum(w * w));
  EXPECT_EQ(calls, 2);
}

TEST(Backward, RemovedHookDoesNotFire) {
  variable w(random_tensor({2}, 7), true);
  int calls = 0;
  auto id = w.add_grad_ready_hook([&](variable&) { ++calls; });
  w.remove_grad_ready_hook(id);
  backward(sum(w));
  EXPECT_EQ(calls, 0);
}

TEST(Backward, HooksFireInReverseOrderOfUse) {
  std::vector<variable> params;
  std::vector<std::string> order;
  for (int layer = 0; layer < 3; ++layer) {
    variable w(random_tensor({4, 4}, 10 + static_cast<std::uint64_t>(layer)), true);
    variable b(random_tensor({4}, 20 + static_cast<std::uint64_t>(layer)), true);
    w.set_name(fmt::format("l{}.w", layer));
    b.set_name(fmt::format("l{}.b", layer));
    for (auto* p : {&w, &b}) {
      p->add_grad_ready_hook([&order](variable& v) { order.push_back(v.name()); });
      params.push_back(*p);
    }
  }
  variable h(random_tensor({2, 4}, 30));
  for (int layer = 0; layer < 3; ++layer)
    h = relu(linear(h, params[2 * static_cast<std::size_t>(layer)],
                    params[2 * static_cast<std::size_t>(layer) + 1]));
  backward(sum(h));
  EXPECT_EQ(order, (std::vector<std::string>{"l2.w", "l2.b", "l1.w", "l1.b", "l0.w", "l0.b"}));
}

TEST(Backward, NoGradRecordsNothing) {
  variable x(random_tensor({3}, 8), true);
  {
    no_grad_guard guard;
    EXPECT_FALSE(grad_enabled());
    auto y = exp(x) * 2.0 + x;
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    // The flag is per thread.
    bool other_thread = false;
    std::thread([&] { other_thread = grad_enabled(); }).join();
    EXPECT_TRUE(other_thread);
  }
  EXPECT_TRUE(grad_enabled());
  auto y = x * 2.0;
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "mul_scalar_backward");
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  {
    grad_mode_guard off(false);
    EXPECT_FALSE((x * 2.0).requires_grad());
  }
}

TEST(Backward, RetainGraphAllowsASecondPassAndFreedGraphIsAnError) {
  variable x(tensor::from<double>({1.0, 2.0}, {2}), true);
  auto loss = sum(x * x);
  backward(loss, {.retain_graph = true});
  backward(loss);
  EXPECT_EQ(values(x.grad()), (std::vector<double>{4.0, 8.0}));
  auto message = error_of([&] { backward(loss); });
  EXPECT_NE(message.find("sum_backward"), std::string::npos) << message;
  EXPECT_NE(message.find("retain_graph"), std::string::npos) << message;
}

TEST(Backward, UsageErrorsNameTheProblem) {
  variable x(random_tensor({2, 3}, 9), true);
  auto y = x * 2.0;
  EXPECT_NE(error_of([&] { backward_from(y, tensor::ones({3, 2}, dtype::float64)); })
                .find("shape [3, 2]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { backward_from(y, tensor::ones({2, 3}, dtype::float32)); })
                .find("dtype"),
            std::string::npos);
  EXPECT_NE(error_of([&] { backward(y); }).find("one element"), std::string::npos);
  variable constant(random_tensor({1}, 10));
  EXPECT_NE(error_of([&] { backward(constant); }).find("does not require"), std::string::npos);
  std::vector<variable> roots{y};
  std::vector<tensor> none;
  EXPECT_NE(error_of([&] { backward(roots, none); }).find("1 roots but 0 gradients"),
            std::string::npos);
  EXPECT_THROW(variable(tensor::zeros({2}, dtype::int64), true), usage_error);
  EXPECT_THROW(y.set_requires_grad(false), usage_error);
  EXPECT_THROW(x.set_grad(tensor::zeros({3}, dtype::float64)), usage_error);
  EXPECT_THROW(variable().data(), usage_error);
}

TEST(Grad, ReturnsGradientsWithoutTouchingLeaves) {
  variable x(tensor::from<double>({1.0, 2.0, 3.0}, {3}), true);
  variable unused(random_tensor({2}, 11), true);
  variable constant(random_tensor({3}, 12));
  int hook_calls = 0;
  x.add_grad_ready_hook([&](variable&) { ++hook_calls; });
  auto h = x * x;
  auto y = sum(h * 3.0);
  auto one = tensor::ones({}, dtype::float64);
  std::vector<variable> outputs{y};
  std::vector<tensor> grads{one};
  std::vector<variable> inputs{x, unused, h, constant};
  auto g = grad(outputs, grads, inputs);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(values(g[0]), (std::vector<double>{6.0, 12.0, 18.0}));
  EXPECT_FALSE(g[1].defined());
  EXPECT_EQ(values(g[2]), (std::vector<double>{3.0, 3.0, 3.0}));
  EXPECT_FALSE(g[3].defined());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_EQ(hook_calls, 0);
}

TEST(Node, SequenceNumbersIncreaseAndAccumulatorsRunFirst) {
  variable x(random_tensor({2}, 13), true);
  auto a = x * 2.0;
  auto b = a * 2.0;
  EXPECT_LT(a.grad_fn()->sequence_nr(), b.grad_fn()->sequence_nr());
  auto edge = a.grad_fn()->next_edges().at(0);
  ASSERT_TRUE(edge.valid());
  EXPECT_EQ(edge.fn->sequence_nr(), node::max_sequence_nr);
  // One accumulator per leaf while a graph holds it.
  EXPECT_EQ(gradient_edge(x).fn, edge.fn);
}

} // namespace
} // namespace troupe::autograd

namespace troupe::autograd {
namespace {

TEST(Backward, LongChainsRunAndFreeWithoutDeepRecursion) {
  variable x(tensor::ones({1}, dtype::float64), true);
  {
    auto y = x;
    for (int i = 0; i < 100000; ++i)
      y = y * 1.0;
    backward(sum(y));
  } // the whole chain is released here
  EXPECT_EQ(x.grad().item(), 1.0);
}

} // namespace
} // namespace troupe::autograd

TEST(BackwardGradientOwnership, CallersGradientIsCopiedNotAliased) {
  // The optimizer updates grad() in place, so a gradient the caller still
  // holds must not become the leaf's grad.
  troupe::autograd::variable leaf(troupe::tensor::ones({4, 4}), true);
  auto given = troupe::tensor::full({4, 4}, 2.0);
  std::vector<troupe::autograd::variable> roots{leaf};
  std::vector<troupe::tensor> grads{given};
  troupe::autograd::backward(roots, grads);
  ASSERT_TRUE(leaf.grad().defined());
  EXPECT_NE(leaf.grad().raw_data(), given.raw_data());
  EXPECT_DOUBLE_EQ(leaf.grad().at({1, 2}), 2.0);
}
