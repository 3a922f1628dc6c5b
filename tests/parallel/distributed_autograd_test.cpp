// The context registry alone: a two-"actor" chain without any actor runtime.
#include "troupe/parallel/distributed_autograd.hpp"

#include <gtest/gtest.h>

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {
namespace {

using autograd::variable;

TEST(DistributedAutograd, GradientCrossesTheBoundaryAsInOneGraph) {
  generator gen{11};
  auto x_data = randn({3, 4}, gen, 0.0, 1.0, dtype::float64);
  variable w1(randn({4, 4}, gen, 0.0, 1.0, dtype::float64), true);
  variable w2(randn({4, 2}, gen, 0.0, 1.0, dtype::float64), true);

  // One graph: the reference.
  auto x = variable(x_data);
  autograd::backward(autograd::sum(autograd::matmul(autograd::tanh(autograd::matmul(x, w1)), w2)));
  auto g1 = w1.grad().clone();
  auto g2 = w2.grad().clone();
  w1.zero_grad();
  w2.zero_grad();

  // Split at the tanh output: producer and consumer each with a registry.
  context_registry producer, consumer;
  const context_key key{7, 2, 0};
  auto h = autograd::tanh(autograd::matmul(variable(x_data), w1));
  producer.record_send(key, h);
  auto received = consumer.receive(key, h.data()); // what would travel
  EXPECT_TRUE(received.requires_grad());
  EXPECT_TRUE(received.is_leaf());
  autograd::backward(autograd::sum(autograd::matmul(received, w2)));
  auto dh = consumer.take_received_grad(key);
  producer.backward_sent(key, dh);

  EXPECT_EQ(max_abs_diff(w1.grad(), g1), 0.0);
  EXPECT_EQ(max_abs_diff(w2.grad(), g2), 0.0);
  EXPECT_TRUE(producer.empty());
  EXPECT_TRUE(consumer.empty());
}

TEST(DistributedAutograd, MisuseNamesTheKey) {
  context_registry r;
  const context_key key{3, 1, 0};
  r.receive(key, tensor::zeros({2}));
  EXPECT_THROW(r.receive(key, tensor::zeros({2})), usage_error);
  EXPECT_THROW(r.backward_sent(key, tensor::zeros({2})), usage_error);
  r.record_send(key, variable(tensor::zeros({2}), true));
  try {
    r.backward_sent(key, tensor::zeros({3}));
    FAIL();
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("context 3 micro-batch 1"), std::string::npos) << e.what();
  }
  // A leaf backward never reached gets a zero gradient.
  auto grad = r.take_received_grad(key);
  EXPECT_EQ(grad.shape(), (dims{2}));
  EXPECT_DOUBLE_EQ(sum(grad).item(), 0.0);
}

TEST(DistributedAutograd, ReleasingAContextDropsOnlyIt) {
  context_registry r;
  r.receive({1, 0, 0}, tensor::zeros({2}));
  r.receive({1, 1, 0}, tensor::zeros({2}));
  r.record_send({2, 0, 0}, variable(tensor::zeros({2}), true));
  r.release_context(1);
  EXPECT_EQ(r.received_count(), 0u);
  EXPECT_EQ(r.sent_count(), 1u);
  EXPECT_TRUE(r.holds_sent({2, 0, 0}));
}

} // namespace
} // namespace troupe::parallel
