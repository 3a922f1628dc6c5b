// Deferred weight gradients: linear's dW kept during backward and computed
// by flush() over all micro-batches at once must equal per-micro-batch
// backward (float64, up to summation order), be delivered like backward's
// (hooks, accumulation), and never apply where it would be wrong (grad(),
// a weight that is not a leaf).
#include <gtest/gtest.h>

#include "gradcheck.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/checkpoint.hpp"
#include "troupe/autograd/deferred_weight_grads.hpp"
#include "troupe/autograd/functions.hpp"

namespace troupe::autograd {
namespace {

using testing::random_tensor;

struct two_layers {
  variable w1{random_tensor({6, 5}, 1), true};
  variable b1{random_tensor({6}, 2), true};
  variable w2{random_tensor({3, 6}, 3), true};
  variable b2{random_tensor({3}, 4), true};

  variable operator()(const variable& x) const { return linear(relu(linear(x, w1, b1)), w2, b2); }
  std::vector<variable> parameters() const { return {w1, b1, w2, b2}; }
};

/// Loss of rows [begin, begin + rows) of x, as a pipeline's micro-batch.
variable micro_batch_loss(const two_layers& net, const tensor& x, std::int64_t begin, std::int64_t rows) {
  return sum(net(variable(x.narrow(0, begin, rows))) * net(variable(x.narrow(0, begin, rows))));
}

TEST(DeferredWeightGrads, FlushEqualsBackwardPerMicroBatch) {
  auto x = random_tensor({12, 5}, 9);
  two_layers plain, deferred_net;
  for (std::int64_t mb = 0; mb < 3; ++mb)
    backward(micro_batch_loss(plain, x, 4 * mb, 4));

  deferred_weight_grads deferred;
  for (std::int64_t mb = 0; mb < 3; ++mb) {
    deferral_scope scope(deferred);
    backward(micro_batch_loss(deferred_net, x, 4 * mb, 4));
  }
  // Before flush: biases have their gradients, weights have none yet.
  EXPECT_TRUE(deferred_net.b1.grad().defined());
  EXPECT_TRUE(deferred_net.b2.grad().defined());
  EXPECT_FALSE(deferred_net.w1.grad().defined());
  EXPECT_FALSE(deferred_net.w2.grad().defined());
  EXPECT_EQ(deferred.weights(), 2u);
  // Kept per use of a layer (micro_batch_loss runs the net twice) in each
  // of 3 micro-batches of 4 rows: x [4, 5] and dy [4, 6] for w1, x [4, 6]
  // and dy [4, 3] for w2, float64.
  EXPECT_EQ(deferred.bytes(), 3u * 2 * (4 * 5 + 4 * 6 + 4 * 6 + 4 * 3) * sizeof(double));

  deferred.flush();
  EXPECT_TRUE(deferred.empty());
  EXPECT_EQ(deferred.bytes(), 0u);
  auto want = plain.parameters();
  auto got = deferred_net.parameters();
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].grad().defined()) << "parameter " << i;
    EXPECT_LT(max_abs_diff(want[i].grad(), got[i].grad()), 1e-12) << "parameter " << i;
  }
}

TEST(DeferredWeightGrads, FlushOneBetweenMicroBatchesAddsUpToBackward) {
  // A pipeline stage delivers one weight at a time while it waits, then
  // flushes the rest after its last micro-batch: the gradients still sum to
  // plain backward's, each weight's hook fires once per delivery, and bytes()
  // counts only what is still kept.
  auto x = random_tensor({12, 5}, 9);
  two_layers plain, net;
  for (std::int64_t mb = 0; mb < 3; ++mb)
    backward(micro_batch_loss(plain, x, 4 * mb, 4));

  std::vector<std::string> fired;
  net.w1.add_grad_ready_hook([&](const variable&) { fired.push_back("w1"); });
  net.w2.add_grad_ready_hook([&](const variable&) { fired.push_back("w2"); });
  deferred_weight_grads deferred;
  EXPECT_FALSE(deferred.flush_one()) << "nothing kept yet";
  const std::size_t per_micro_batch = 2 * (4 * 5 + 4 * 6 + 4 * 6 + 4 * 3) * sizeof(double);
  for (std::int64_t mb = 0; mb < 3; ++mb) {
    {
      deferral_scope scope(deferred);
      backward(micro_batch_loss(net, x, 4 * mb, 4));
    }
    if (mb == 0) {
      ASSERT_TRUE(deferred.flush_one()); // w2 (deferred first), micro-batch 0
      EXPECT_EQ(deferred.weights(), 1u);
      EXPECT_EQ(deferred.bytes(), 2u * (4 * 5 + 4 * 6) * sizeof(double)) << "only w1's factors remain";
    }
    if (mb == 1) {
      ASSERT_TRUE(deferred.flush_one()); // w1, micro-batches 0 and 1
      ASSERT_TRUE(deferred.flush_one()); // w2, micro-batch 1
      EXPECT_FALSE(deferred.flush_one());
      EXPECT_EQ(deferred.bytes(), 0u);
    }
  }
  EXPECT_EQ(deferred.bytes(), per_micro_batch);
  deferred.flush();
  EXPECT_EQ(fired, (std::vector<std::string>{"w2", "w1", "w2", "w2", "w1"}));
  EXPECT_LT(max_abs_diff(plain.w1.grad(), net.w1.grad()), 1e-12);
  EXPECT_LT(max_abs_diff(plain.w2.grad(), net.w2.grad()), 1e-12);
}

TEST(DeferredWeightGrads, FlushAccumulatesIntoAnExistingGradientAndFiresHooksInDeferralOrder) {
  auto x = random_tensor({4, 5}, 9);
  two_layers plain, net;
  backward(micro_batch_loss(plain, x, 0, 4));
  backward(micro_batch_loss(plain, x, 0, 4));

  backward(micro_batch_loss(net, x, 0, 4)); // an earlier, immediate pass
  std::vector<std::string> fired;
  net.w1.add_grad_ready_hook([&](const variable&) { fired.push_back("w1"); });
  net.w2.add_grad_ready_hook([&](const variable&) { fired.push_back("w2"); });
  deferred_weight_grads deferred;
  {
    deferral_scope scope(deferred);
    backward(micro_batch_loss(net, x, 0, 4));
  }
  EXPECT_TRUE(fired.empty()) << "a weight's hook fired before flush";
  deferred.flush();
  // Backward reaches the last layer first; flush keeps that order.
  EXPECT_EQ(fired, (std::vector<std::string>{"w2", "w1"}));
  EXPECT_LT(max_abs_diff(plain.w1.grad(), net.w1.grad()), 1e-12);
  EXPECT_LT(max_abs_diff(plain.w2.grad(), net.w2.grad()), 1e-12);
}

TEST(DeferredWeightGrads, GradIsNeverDeferred) {
  auto x = random_tensor({4, 5}, 9);
  two_layers net;
  deferred_weight_grads deferred;
  deferral_scope scope(deferred);
  auto loss = micro_batch_loss(net, x, 0, 4);
  auto seed = tensor::ones(loss.shape(), loss.type());
  std::vector<variable> wrt{net.w1, net.w2};
  auto grads = grad(std::span<const variable>(&loss, 1), std::span<const tensor>(&seed, 1), wrt);
  EXPECT_TRUE(grads[0].defined());
  EXPECT_TRUE(grads[1].defined());
  EXPECT_TRUE(deferred.empty());
  EXPECT_FALSE(net.w1.grad().defined()) << "grad() touched a leaf";
}

TEST(DeferredWeightGrads, AWeightThatIsNotALeafIsComputedAtOnce) {
  auto x = random_tensor({4, 5}, 9);
  variable w(random_tensor({3, 5}, 1), true);
  deferred_weight_grads deferred;
  {
    deferral_scope scope(deferred);
    backward(sum(linear(variable(x), w * 2.0, variable())));
  }
  EXPECT_TRUE(deferred.empty());
  ASSERT_TRUE(w.grad().defined());
  // d/dW sum(x (2W)^T) = 2 * column sums of x, for every output row.
  auto want = sum(x, {0}) * 2.0;
  for (std::int64_t r = 0; r < 3; ++r)
    EXPECT_LT(max_abs_diff(w.grad().narrow(0, r, 1).reshape({5}), want), 1e-12);
}

TEST(DeferredWeightGrads, CheckpointedLayersDeferToo) {
  auto x = random_tensor({4, 5}, 9);
  two_layers plain, net;
  backward(micro_batch_loss(plain, x, 0, 4));
  deferred_weight_grads deferred;
  {
    deferral_scope scope(deferred);
    auto out = checkpoint([&](const std::vector<variable>& in) { return std::vector<variable>{net(in[0])}; },
                          {variable(x)});
    backward(sum(out[0] * out[0]));
  }
  EXPECT_EQ(deferred.weights(), 2u);
  deferred.flush();
  EXPECT_LT(max_abs_diff(plain.w1.grad(), net.w1.grad()), 1e-12);
  EXPECT_LT(max_abs_diff(plain.w2.grad(), net.w2.grad()), 1e-12);
}

TEST(DeferredWeightGrads, ClearDropsWhatWasKept) {
  auto x = random_tensor({4, 5}, 9);
  two_layers net;
  deferred_weight_grads deferred;
  {
    deferral_scope scope(deferred);
    backward(micro_batch_loss(net, x, 0, 4));
  }
  deferred.clear();
  deferred.flush();
  EXPECT_FALSE(net.w1.grad().defined());
  EXPECT_FALSE(net.w2.grad().defined());
}

TEST(DeferredWeightGrads, ScopesNestAndEndWithTheirLifetime) {
  deferred_weight_grads outer, inner;
  EXPECT_EQ(deferral_scope::active(), nullptr);
  {
    deferral_scope a(outer);
    {
      deferral_scope b(inner);
      EXPECT_EQ(deferral_scope::active(), &inner);
    }
    EXPECT_EQ(deferral_scope::active(), &outer);
  }
  EXPECT_EQ(deferral_scope::active(), nullptr);
}

} // namespace
} // namespace troupe::autograd
