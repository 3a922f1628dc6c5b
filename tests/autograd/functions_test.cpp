// Every differentiable function against float64 finite differences, plus the
// view and forward-value properties the functions promise.
#include <gtest/gtest.h>

#include "gradcheck.hpp"
#include "troupe/autograd/functions.hpp"

namespace troupe::autograd {
namespace {

using testing::gradcheck;
using testing::positive_tensor;
using testing::random_tensor;
using inputs = std::vector<variable>;

tensor int64s(std::vector<std::int64_t> values, const dims& shape) {
  return tensor::from(values, shape);
}

// -- elementwise ----------------------------------------------------------------------

TEST(FunctionsGradcheck, AddSubMulDivSameShape) {
  auto a = random_tensor({3, 4}, 1);
  auto b = positive_tensor({3, 4}, 2);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] + v[1]; }, {a, b}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] - v[1]; }, {a, b}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] * v[1]; }, {a, b}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] / v[1]; }, {a, b}));
}

TEST(FunctionsGradcheck, BroadcastingSumsGradientsBack) {
  auto a = random_tensor({2, 3, 4}, 3);
  auto row = positive_tensor({4}, 4);
  auto column = positive_tensor({3, 1}, 5);
  auto ones_middle = positive_tensor({2, 1, 4}, 6);
  for (const auto& b : {row, column, ones_middle}) {
    EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] + v[1]; }, {a, b}));
    EXPECT_TRUE(gradcheck([](const inputs& v) { return v[1] - v[0]; }, {a, b}));
    EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] * v[1]; }, {a, b}));
    EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] / v[1]; }, {a, b}));
    EXPECT_TRUE(gradcheck([](const inputs& v) { return v[1] / (v[0] * v[0] + 1.0); }, {a, b}));
  }
}

TEST(FunctionsGradcheck, ScalarOperandsAndNeg) {
  auto a = random_tensor({5}, 7);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] + 2.5; }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return v[0] * -1.5; }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return 3.0 * v[0]; }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return -v[0]; }, {a}));
}

TEST(FunctionsGradcheck, ElementwiseMath) {
  auto a = random_tensor({3, 5}, 8);
  auto p = positive_tensor({3, 5}, 9);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return exp(v[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return log(v[0]); }, {p}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return tanh(v[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return sqrt(v[0]); }, {p}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return pow(v[0], 3.0); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return pow(v[0], -0.5); }, {p}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return relu(v[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return gelu(v[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return gelu(v[0], gelu_approximation::tanh); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return gelu(v[0], gelu_approximation::tanh); },
                        {random_tensor({37}, 50, 0.0, 4.0)}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return sigmoid(v[0]); }, {a}));
}

// -- reductions -------------------------------------------------------------------------

TEST(FunctionsGradcheck, SumAndMean) {
  auto a = random_tensor({2, 3, 4}, 10);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return sum(v[0]); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return mean(v[0]); }, {a}));
  for (bool keepdim : {false, true}) {
    EXPECT_TRUE(gradcheck([=](const inputs& v) { return sum(v[0], {1}, keepdim); }, {a}));
    EXPECT_TRUE(gradcheck([=](const inputs& v) { return sum(v[0], {0, 2}, keepdim); }, {a}));
    EXPECT_TRUE(gradcheck([=](const inputs& v) { return mean(v[0], {-1}, keepdim); }, {a}));
    EXPECT_TRUE(gradcheck([=](const inputs& v) { return mean(v[0], {0, 1}, keepdim); }, {a}));
  }
}

TEST(FunctionsGradcheck, Max) {
  auto a = random_tensor({3, 4, 2}, 11);
  for (bool keepdim : {false, true})
    for (std::int64_t dim : {0, 1, -1})
      EXPECT_TRUE(gradcheck([=](const inputs& v) { return max(v[0], dim, keepdim); }, {a}));
}

TEST(FunctionsGradcheck, SoftmaxAndLogSoftmax) {
  auto a = random_tensor({3, 5}, 12);
  for (std::int64_t dim : {0, 1}) {
    EXPECT_TRUE(gradcheck([=](const inputs& v) { return softmax(v[0], dim); }, {a}));
    EXPECT_TRUE(gradcheck([=](const inputs& v) { return log_softmax(v[0], dim); }, {a}));
  }
}

// -- shape ---------------------------------------------------------------------------------

TEST(FunctionsGradcheck, Views) {
  auto a = random_tensor({2, 3, 4}, 13);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return reshape(v[0], {6, -1}); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return transpose(v[0], 0, 2); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return permute(v[0], {1, 2, 0}); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return narrow(v[0], 2, 1, 2); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return unsqueeze(v[0], 1); }, {a}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return squeeze(unsqueeze(v[0], 3), 3); }, {a}));
  auto b = random_tensor({3, 1}, 14);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return expand(v[0], {2, 3, 4}); }, {b}));
  // A view of a view, then math: gradients flow back through both.
  EXPECT_TRUE(gradcheck(
      [](const inputs& v) { return tanh(reshape(transpose(v[0], 0, 1), {3, 8})); }, {a}));
}

TEST(FunctionsGradcheck, CatAndStack) {
  auto a = random_tensor({2, 3}, 15);
  auto b = random_tensor({2, 1}, 16);
  auto c = random_tensor({2, 3}, 17);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return cat({v[0], v[1], v[2]}, 1); }, {a, b, c}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return cat({v[0], v[1]}, 0); }, {a, c}));
  for (std::int64_t dim : {0, 1, 2})
    EXPECT_TRUE(gradcheck([=](const inputs& v) { return stack({v[0], v[1]}, dim); }, {a, c}));
}

TEST(FunctionsGradcheck, SplitAndChunk) {
  auto a = random_tensor({5, 4}, 18);
  // Pieces weighted differently, one piece unused (its gradient is zero).
  EXPECT_TRUE(gradcheck(
      [](const inputs& v) {
        auto pieces = split(v[0], 2, 0); // 2, 2, 1 rows
        return cat({pieces[2] * 3.0, pieces[0]}, 0);
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const inputs& v) {
        auto pieces = chunk(v[0], 2, 1);
        return pieces[0] * pieces[1];
      },
      {a}));
}

// -- linear algebra -------------------------------------------------------------------------

TEST(FunctionsGradcheck, Matmul) {
  auto a = random_tensor({3, 4}, 19);
  auto b = random_tensor({4, 2}, 20);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return matmul(v[0], v[1]); }, {a, b}));
  // Transposed operands (views) on either side.
  auto at = random_tensor({4, 3}, 21);
  auto bt = random_tensor({2, 4}, 22);
  EXPECT_TRUE(gradcheck(
      [](const inputs& v) { return matmul(transpose(v[0], 0, 1), transpose(v[1], 0, 1)); },
      {at, bt}));
}

TEST(FunctionsGradcheck, Bmm) {
  auto a = random_tensor({2, 3, 4}, 23);
  auto b = random_tensor({2, 4, 5}, 24);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return bmm(v[0], v[1]); }, {a, b}));
}

TEST(FunctionsGradcheck, Linear) {
  auto x = random_tensor({3, 4}, 25);
  auto w = random_tensor({5, 4}, 26);
  auto b = random_tensor({5}, 27);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return linear(v[0], v[1], v[2]); }, {x, w, b}));
  EXPECT_TRUE(gradcheck([](const inputs& v) { return linear(v[0], v[1], variable()); }, {x, w}));
  auto x3 = random_tensor({2, 3, 4}, 28);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return linear(v[0], v[1], v[2]); }, {x3, w, b}));
}

// -- indexing ----------------------------------------------------------------------------------

TEST(FunctionsGradcheck, IndexSelectGatherScatterAdd) {
  auto a = random_tensor({4, 3}, 29);
  auto rows = int64s({2, 0, 2, 3}, {4}); // repeated index accumulates
  EXPECT_TRUE(gradcheck([&](const inputs& v) { return index_select(v[0], 0, rows); }, {a}));
  auto cols = int64s({1, 1}, {2});
  EXPECT_TRUE(gradcheck([&](const inputs& v) { return index_select(v[0], 1, cols); }, {a}));
  auto where = int64s({0, 2, 1, 1, 2, 2, 0, 0}, {4, 2});
  EXPECT_TRUE(gradcheck([&](const inputs& v) { return gather(v[0], 1, where); }, {a}));
  auto src = random_tensor({4, 2}, 30);
  EXPECT_TRUE(gradcheck([&](const inputs& v) { return scatter_add(v[0], 1, where, v[1]); },
                        {a, src}));
}

TEST(FunctionsGradcheck, Embedding) {
  auto w = random_tensor({5, 3}, 31);
  auto ids = int64s({4, 0, 4, 1, 2, 4}, {2, 3});
  EXPECT_TRUE(gradcheck([&](const inputs& v) { return embedding(v[0], ids); }, {w}));
  variable weight(w);
  EXPECT_EQ(embedding(weight, ids).shape(), (dims{2, 3, 3}));
}

TEST(FunctionsGradcheck, EmbeddingBagSumAndMean) {
  auto w = random_tensor({6, 3}, 32);
  auto ids = int64s({1, 5, 1, 0, 3, 3, 2}, {7});
  auto offsets = int64s({0, 3, 3, 5}, {4}); // bag 1 is empty
  for (auto mode : {bag_mode::sum, bag_mode::mean})
    EXPECT_TRUE(
        gradcheck([&](const inputs& v) { return embedding_bag(v[0], ids, offsets, mode); }, {w}));
}

// -- convolution, pooling, normalisation, dropout ---------------------------------------------------

TEST(FunctionsGradcheck, Conv2d) {
  auto x = random_tensor({2, 2, 5, 5}, 33);
  auto w = random_tensor({3, 2, 3, 3}, 34);
  auto b = random_tensor({3}, 35);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return conv2d(v[0], v[1], v[2]); }, {x, w, b}));
  conv2d_options strided{.stride = 2, .padding = 1};
  EXPECT_TRUE(gradcheck([=](const inputs& v) { return conv2d(v[0], v[1], v[2], strided); },
                        {x, w, b}));
  EXPECT_TRUE(gradcheck([=](const inputs& v) { return conv2d(v[0], v[1], variable(), strided); },
                        {x, w}));
}

TEST(FunctionsGradcheck, MaxPool2d) {
  auto x = random_tensor({2, 2, 4, 6}, 36);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return max_pool2d(v[0]); }, {x}));
  pool2d_options overlapping{.kernel = 3, .stride = 1};
  EXPECT_TRUE(gradcheck([=](const inputs& v) { return max_pool2d(v[0], overlapping); }, {x}));
}

TEST(FunctionsGradcheck, LayerNorm) {
  auto x = random_tensor({3, 5}, 37);
  auto w = random_tensor({5}, 38, 1.0, 0.5);
  auto b = random_tensor({5}, 39);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return layer_norm(v[0], v[1], v[2]); }, {x, w, b}));
  EXPECT_TRUE(
      gradcheck([](const inputs& v) { return layer_norm(v[0], variable(), variable()); }, {x}));
  auto x3 = random_tensor({2, 2, 4}, 40);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return layer_norm(v[0], v[1], v[2]); },
                        {x3, random_tensor({4}, 41), random_tensor({4}, 42)}));
}

TEST(FunctionsGradcheck, DropoutWithReplayedMask) {
  auto x = random_tensor({4, 6}, 43);
  // Each evaluation replays the same stream, so the mask is fixed.
  auto f = [](const inputs& v) {
    default_generator() = generator{99, 0};
    return dropout(v[0], 0.4, true);
  };
  EXPECT_TRUE(gradcheck(f, {x}));
  // The mask did drop something and scaled the rest by 1 / (1 - p).
  variable input(tensor::ones({4, 6}, dtype::float64));
  auto out = f({input}).data().to_vector<double>();
  int dropped = 0;
  for (double value : out) {
    if (value == 0.0)
      ++dropped;
    else
      EXPECT_NEAR(value, 1.0 / 0.6, 1e-12);
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, 24);
}

TEST(Functions, DropoutIsIdentityWhenNotTrainingOrZeroProbability) {
  variable x(random_tensor({3}, 44), true);
  EXPECT_TRUE(dropout(x, 0.5, false).same(x));
  EXPECT_TRUE(dropout(x, 0.0, true).same(x));
  EXPECT_THROW(dropout(x, 1.5, true), usage_error);
}

// -- losses --------------------------------------------------------------------------------------

TEST(FunctionsGradcheck, CrossEntropy) {
  auto logits = random_tensor({4, 3}, 45);
  auto targets = int64s({2, 0, 1, 2}, {4});
  EXPECT_TRUE(gradcheck([&](const inputs& v) { return cross_entropy(v[0], targets); }, {logits}));
}

TEST(FunctionsGradcheck, CrossEntropyOfOddWidthsAndATransposedInput) {
  // Rows not a multiple of the vector width, and logits that reach the op
  // as a transposed view of a [classes, n] tensor.
  for (std::int64_t classes : {5, 9, 13}) {
    SCOPED_TRACE(classes);
    auto targets = int64s({0, classes - 1, 2, 1, classes / 2}, {5});
    EXPECT_TRUE(gradcheck([&](const inputs& v) { return cross_entropy(v[0], targets); },
                          {random_tensor({5, classes}, 48, 0.0, 3.0)}));
    EXPECT_TRUE(gradcheck([&](const inputs& v) { return cross_entropy(transpose(v[0], 0, 1), targets); },
                          {random_tensor({classes, 5}, 49)}));
  }
}

TEST(FunctionsGradcheck, CausalSoftmaxOfOddLengthsAndATransposedInput) {
  // Square and non-square score matrices, and scores that reach the op as
  // a transposed view.
  for (std::int64_t keys : {1, 5, 9}) {
    SCOPED_TRACE(keys);
    EXPECT_TRUE(gradcheck([](const inputs& v) { return causal_softmax(v[0], 0.4); },
                          {random_tensor({2, keys, keys}, 50, 0.0, 3.0)}));
    EXPECT_TRUE(gradcheck([](const inputs& v) { return causal_softmax(v[0], 1.3); },
                          {random_tensor({3, keys}, 51)}));
    EXPECT_TRUE(gradcheck([](const inputs& v) { return causal_softmax(transpose(v[0], 1, 2), 0.7); },
                          {random_tensor({2, keys, 4}, 52)}));
  }
}

TEST(FunctionsGradcheck, CausalAttention) {
  // Sequences within one block of query rows and across blocks (32 rows),
  // and qkv reaching the op as a strided view.
  for (std::int64_t seq : {1, 6, 35}) {
    SCOPED_TRACE(seq);
    EXPECT_TRUE(gradcheck([](const inputs& v) { return causal_attention(v[0], 2, 0.8); },
                          {random_tensor({2, seq, 3 * 2 * 2}, 53, 0.0, 2.0)}));
    EXPECT_TRUE(gradcheck([](const inputs& v) { return causal_attention(narrow(v[0], 2, 1, 9), 3, 1.1); },
                          {random_tensor({1, seq, 10}, 54)}));
    // With dropout on the weights, as a fixed mask.
    generator gen{55};
    const auto mask = dropout_mask({2 * 2, seq, seq}, 0.4, gen, dtype::float64);
    EXPECT_TRUE(gradcheck([&](const inputs& v) { return causal_attention(v[0], 2, 0.8, mask); },
                          {random_tensor({2, seq, 3 * 2 * 2}, 56, 0.0, 2.0)}));
  }
}

TEST(Functions, CrossEntropyMatchesReferenceAndNamesBadTarget) {
  auto logits = tensor::from<double>({1.0, 2.0, 3.0, 0.5, 0.5, 0.5}, {2, 3});
  variable x(logits, true);
  auto loss = cross_entropy(x, int64s({2, 0}, {2})).item();
  double row0 = -(3.0 - std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)));
  double row1 = std::log(3.0);
  EXPECT_NEAR(loss, (row0 + row1) / 2, 1e-12);
  try {
    cross_entropy(x, int64s({1, 3}, {2}));
    FAIL() << "expected usage_error";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("target 3 at position 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cross_entropy(x, int64s({-1, 0}, {2})), usage_error);
  EXPECT_THROW(cross_entropy(x, int64s({0, 0, 0}, {3})), usage_error);
}

TEST(FunctionsGradcheck, MseLoss) {
  auto a = random_tensor({3, 4}, 46);
  auto b = random_tensor({3, 4}, 47);
  EXPECT_TRUE(gradcheck([](const inputs& v) { return mse_loss(v[0], v[1]); }, {a, b}));
  variable x(a), y(b);
  auto expected = mean(mul((a - b), (a - b))).item();
  EXPECT_DOUBLE_EQ(mse_loss(x, y).item(), expected);
}

// -- views share storage ----------------------------------------------------------------------

TEST(Functions, ViewFunctionsShareTheInputStorage) {
  variable a(random_tensor({2, 3, 4}, 48), true);
  const auto& data = a.data();
  EXPECT_TRUE(reshape(a, {6, 4}).data().shares_storage_with(data));
  EXPECT_TRUE(transpose(a, 0, 1).data().shares_storage_with(data));
  EXPECT_TRUE(permute(a, {2, 0, 1}).data().shares_storage_with(data));
  EXPECT_TRUE(narrow(a, 1, 1, 2).data().shares_storage_with(data));
  EXPECT_TRUE(unsqueeze(a, 0).data().shares_storage_with(data));
  EXPECT_TRUE(squeeze(unsqueeze(a, 0), 0).data().shares_storage_with(data));
  variable b(random_tensor({3, 1}, 49), true);
  EXPECT_TRUE(expand(b, {2, 3, 5}).data().shares_storage_with(b.data()));
  for (const auto& piece : split(a, 2, 2))
    EXPECT_TRUE(piece.data().shares_storage_with(data));
  for (const auto& piece : chunk(a, 3, 1))
    EXPECT_TRUE(piece.data().shares_storage_with(data));
}

TEST(Functions, LinearMatchesMatmulPlusBias) {
  auto x = random_tensor({2, 3, 4}, 50);
  auto w = random_tensor({5, 4}, 51);
  auto b = random_tensor({5}, 52);
  auto y = linear(variable(x), variable(w), variable(b));
  EXPECT_EQ(y.shape(), (dims{2, 3, 5}));
  auto reference = add(matmul(x.reshape({6, 4}), w.t()), b).reshape({2, 3, 5});
  EXPECT_LT(max_abs_diff(y.data(), reference), 1e-12);
  EXPECT_THROW(linear(variable(x), variable(random_tensor({5, 3}, 53)), variable()), usage_error);
}

} // namespace
} // namespace troupe::autograd

namespace troupe::autograd {
namespace {

TEST(Gradcheck, DetectsAWrongGradient) {
  // The second factor hides from autograd (a detached copy of the same
  // storage) but not from finite differences: d/dx x*x is 2x, autograd says x.
  auto wrong = [](const std::vector<variable>& v) { return v[0] * v[0].detach(); };
  EXPECT_FALSE(testing::gradcheck(wrong, {testing::random_tensor({3}, 60)}));
}

} // namespace
} // namespace troupe::autograd
