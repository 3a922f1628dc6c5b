// Reductions, softmax, causal softmax and cross-entropy against float64 references.
#include <algorithm>
#include <cmath>

#include "test_util.hpp"
#include "troupe/tensor/backend.hpp"

namespace troupe {
namespace {

using test::expect_close;
using test::make;
using test::sample;
using test::values;
using testing::HasSubstr;

TEST(Reduce, SumOverEachDimensionSetMatchesNestedLoops) {
  auto a = sample({2, 3, 4}, 1);
  auto v = values(a);
  auto at = [&](int i, int j, int k) { return v[(i * 3 + j) * 4 + k]; };
  double total = 0;
  for (auto x : v)
    total += x;
  EXPECT_NEAR(sum(a).item(), total, 1e-13);
  EXPECT_EQ(sum(a).rank(), 0);

  std::vector<double> over1;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 4; ++k) {
      double s = 0;
      for (int j = 0; j < 3; ++j)
        s += at(i, j, k);
      over1.push_back(s);
    }
  EXPECT_EQ(sum(a, {1}).shape(), (dims{2, 4}));
  expect_close(sum(a, {1}), over1, 1e-14);
  EXPECT_EQ(sum(a, {-2}, true).shape(), (dims{2, 1, 4}));
  expect_close(sum(a, {1}, true), over1, 1e-14);

  std::vector<double> over02;
  for (int j = 0; j < 3; ++j) {
    double s = 0;
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < 4; ++k)
        s += at(i, j, k);
    over02.push_back(s);
  }
  expect_close(sum(a, {2, 0}), over02, 1e-14);
  expect_close(mean(a, {0, 2}), std::vector<double>{over02[0] / 8, over02[1] / 8, over02[2] / 8},
               1e-14);
  EXPECT_NEAR(mean(a).item(), total / 24, 1e-14);
  EXPECT_THAT(test::usage_error_of([&] { (void)sum(a, {1, 1}); }), HasSubstr("sum"));
  EXPECT_THAT(test::usage_error_of([&] { (void)sum(a, {3}); }), HasSubstr("sum"));
}

TEST(Reduce, SumIsBitwiseIndependentOfTheLayout) {
  auto a = sample({37, 53}, 2, dtype::float32);
  auto transposed = a.t().contiguous().t(); // same values, column-major
  EXPECT_EQ(values(sum(a, {1})), values(sum(transposed, {1})));
  EXPECT_EQ(values(sum(a, {0})), values(sum(transposed, {0})));
  EXPECT_EQ(sum(a).item(), sum(transposed).item());
}

// Column sums of a row-major matrix (a bias gradient) take a path that reads
// memory a line at a time; it must add in exactly row_sum's order.
TEST(Reduce, ColumnSumsOfARowMajorMatrixEqualTheRowPathBitwise) {
  for (auto type : {dtype::float32, dtype::float64, dtype::int64})
    for (std::int64_t n : {1, 7, 8, 9, 64, 129, 300, 1000})
      for (std::int64_t cols : {1, 3, 8, 255, 256, 257, 1025}) {
        auto a = sample({n, cols}, static_cast<std::uint64_t>(n * 7919 + cols), type);
        auto by_columns = sum(a, {0});                   // rows side by side: the new path
        auto by_rows = sum(a.t().contiguous(), {1});      // the same sums, one row at a time
        ASSERT_EQ(values(by_columns), values(by_rows)) << "n " << n << ", cols " << cols << ", " << name_of(type);
      }
}

TEST(Reduce, Float32SumsStayAccurate) {
  auto a = tensor::full({100000}, 0.1, dtype::float32);
  EXPECT_NEAR(sum(a).item(), 10000.0, 0.05);
}

TEST(Reduce, MaxAndArgmaxPickTheFirstMaximum) {
  auto a = make({1, 5, 5, 2, -1, 0, 9, 9}, {2, 4});
  auto [value, index] = max(a, 1);
  expect_close(value, std::vector<double>{5, 9}, 0);
  EXPECT_EQ(index.type(), dtype::int64);
  EXPECT_EQ(index.to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(argmax(a, 0).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(max(a, 0, true).values.shape(), (dims{1, 4}));
  EXPECT_EQ(max_all(a).item(), 9.0);
  EXPECT_EQ(max_all(a).rank(), 0);
  EXPECT_THAT(test::usage_error_of([] { (void)max(tensor::zeros({2, 0}), 1); }),
              HasSubstr("max: dimension 1 of [2, 0] is empty"));
}

std::vector<double> softmax_reference(const tensor& x, bool log) {
  // Rows along the last dimension of a 2-D tensor.
  auto v = values(x);
  const auto rows = x.size(0);
  const auto cols = x.size(1);
  std::vector<double> out(v.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double top = -INFINITY;
    for (std::int64_t j = 0; j < cols; ++j)
      top = std::max(top, v[r * cols + j]);
    double total = 0;
    for (std::int64_t j = 0; j < cols; ++j)
      total += std::exp(v[r * cols + j] - top);
    for (std::int64_t j = 0; j < cols; ++j)
      out[r * cols + j] = log ? v[r * cols + j] - top - std::log(total)
                              : std::exp(v[r * cols + j] - top) / total;
  }
  return out;
}

TEST(Reduce, SoftmaxAndLogSoftmaxMatchTheReferenceAlongAnyDim) {
  auto x = mul(sample({3, 5}, 3), 10.0);
  expect_close(softmax(x, 1), softmax_reference(x, false), 1e-14);
  expect_close(log_softmax(x, -1), softmax_reference(x, true), 1e-14);
  // Along dim 0: the reference on the transpose, transposed back.
  auto along0 = softmax(x, 0);
  expect_close(along0.t().contiguous(), softmax_reference(x.t(), false), 1e-14);
  auto f32 = softmax(x.to(dtype::float32), 1);
  EXPECT_EQ(f32.type(), dtype::float32);
  expect_close(f32, softmax_reference(x, false), 1e-6);
}

TEST(Reduce, SoftmaxBackwardsMatchFiniteDifferences) {
  auto x = sample({2, 4}, 4);
  auto g = sample({2, 4}, 5);
  for (std::int64_t dim : {0, 1}) {
    auto numeric = test::numeric_gradient(
        [&](const tensor& v) { return test::weighted_sum(softmax(v, dim), g); }, x);
    expect_close(softmax_backward(g, softmax(x, dim), dim), numeric, 1e-7);
    auto numeric_log = test::numeric_gradient(
        [&](const tensor& v) { return test::weighted_sum(log_softmax(v, dim), g); }, x);
    expect_close(log_softmax_backward(g, log_softmax(x, dim), dim), numeric_log, 1e-7);
  }
}

/// dL/dx of softmax (log: log-softmax) rows in float64 from x and dL/dy.
std::vector<double> softmax_backward_reference(const tensor& x, const tensor& g, bool log) {
  auto y = softmax_reference(x, false);
  auto gv = values(g);
  const auto rows = x.size(0);
  const auto cols = x.size(1);
  std::vector<double> out(y.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    double total = 0;
    for (std::int64_t j = 0; j < cols; ++j)
      total += log ? gv[r * cols + j] : gv[r * cols + j] * y[r * cols + j];
    for (std::int64_t j = 0; j < cols; ++j) {
      const auto k = r * cols + j;
      out[k] = log ? gv[k] - y[k] * total : y[k] * (gv[k] - total);
    }
  }
  return out;
}

// Row lengths around the vector widths (4 doubles, 8 floats, blocks of 128):
// every partial last vector and more than one block.
TEST(Reduce, SoftmaxRowsOfEveryLengthMatchTheFloat64Reference) {
  for (std::int64_t cols : {1, 3, 4, 5, 7, 8, 9, 15, 17, 31, 33, 86, 127, 129, 300, 1031}) {
    SCOPED_TRACE(cols);
    auto x = mul(sample({3, cols}, 7), 8.0);
    auto g = sample({3, cols}, 8);
    for (bool log : {false, true}) {
      auto y = log ? log_softmax(x, 1) : softmax(x, 1);
      expect_close(y, softmax_reference(x, log), 1e-14);
      expect_close(log ? log_softmax_backward(g, y, 1) : softmax_backward(g, y, 1),
                   softmax_backward_reference(x, g, log), 1e-13);
      // float32 within 1e-6 (1 + |ref|) of the float64 result: a few ulp of
      // exp, the sum's rounding and the shift.
      auto x32 = x.to(dtype::float32);
      auto y32 = log ? log_softmax(x32, 1) : softmax(x32, 1);
      expect_close(y32, softmax_reference(x, log), 1e-6);
      auto g32 = g.to(dtype::float32);
      expect_close(log ? log_softmax_backward(g32, y32, 1) : softmax_backward(g32, y32, 1),
                   softmax_backward_reference(x, g, log), 1e-6);
    }
  }
}

TEST(Reduce, SoftmaxOfAStridedViewEqualsSoftmaxOfItsCopy) {
  // A transposed view and a narrowed one (offset, row stride 13) go through
  // the same contiguous rows as their copies: bitwise the same result.
  auto base = mul(sample({9, 13}, 9), 4.0);
  for (dtype type : {dtype::float64, dtype::float32}) {
    auto x = base.to(type);
    for (const auto& view : {x.t(), x.narrow(1, 1, 11)}) {
      EXPECT_EQ(values(softmax(view, 1)), values(softmax(view.contiguous(), 1)));
      EXPECT_EQ(values(log_softmax(view, 0)), values(log_softmax(view.contiguous(), 0)));
    }
  }
}

TEST(Reduce, SoftmaxOfMaskedRowsIsZeroWhereMasked) {
  // A causal mask writes -inf: those positions get exactly 0 (log: -inf),
  // the others the softmax of the rest.
  for (dtype type : {dtype::float64, dtype::float32}) {
    auto x = tensor::from(std::vector<double>{1, -INFINITY, 2, -INFINITY, 3, 0, -INFINITY, -INFINITY, 0.5},
                          {1, 9})
               .to(type);
    auto y = values(softmax(x, 1));
    auto ly = values(log_softmax(x, 1));
    const double total = std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(0.0) + std::exp(0.5);
    for (int j : {1, 3, 6, 7}) {
      EXPECT_EQ(y[j], 0.0);
      EXPECT_EQ(ly[j], -INFINITY);
    }
    EXPECT_NEAR(y[4], std::exp(3.0) / total, 1e-6);
    EXPECT_NEAR(ly[8], 0.5 - std::log(total), 1e-6);
  }
}

/// -mean(gather(log_softmax(logits, 1), 1, targets)) and its gradient in
/// float64 from the composed ops: what the fused op must equal.
struct composed_cross_entropy {
  double loss;
  tensor grad;
};

composed_cross_entropy cross_entropy_by_composed_ops(const tensor& logits, const tensor& targets, double upstream) {
  const auto n = logits.size(0);
  auto log_probs = log_softmax(logits.to(dtype::float64), 1);
  auto picked = gather(log_probs, 1, targets.reshape({n, 1}));
  // d(-mean(picked)) / d(picked) = -upstream / n at each target.
  auto grad_picked = tensor::full({n, 1}, -upstream / static_cast<double>(n), dtype::float64);
  auto grad_log_probs = scatter_add(tensor::zeros(log_probs.shape(), dtype::float64), 1, targets.reshape({n, 1}),
                                    grad_picked);
  return {-mean(picked).item(), log_softmax_backward(grad_log_probs, log_probs, 1)};
}

TEST(CrossEntropy, FusedEqualsTheComposedOpsForEveryRowLength) {
  for (std::int64_t classes : {1, 2, 3, 5, 7, 8, 9, 17, 86, 129, 1000}) {
    SCOPED_TRACE(classes);
    const std::int64_t n = 11;
    auto logits = mul(sample({n, classes}, 30), 6.0);
    generator gen{31, 0};
    auto targets = randint({n}, gen, 0, classes);
    auto ref = cross_entropy_by_composed_ops(logits, targets, 0.75);
    auto r = cross_entropy(logits, targets);
    EXPECT_EQ(r.loss.rank(), 0);
    EXPECT_NEAR(r.loss.item(), ref.loss, 1e-14 * (1 + std::abs(ref.loss)));
    auto upstream = tensor::full({}, 0.75, dtype::float64);
    expect_close(cross_entropy_backward(upstream, logits, targets, r.log_sum_exp), ref.grad, 1e-14);
    // float32 within 1e-6 (1 + |ref|) of the float64 result.
    auto logits32 = logits.to(dtype::float32);
    auto r32 = cross_entropy(logits32, targets);
    EXPECT_EQ(r32.loss.type(), dtype::float32);
    EXPECT_NEAR(r32.loss.item(), ref.loss, 1e-6 * (1 + std::abs(ref.loss)));
    expect_close(cross_entropy_backward(upstream.to(dtype::float32), logits32, targets, r32.log_sum_exp), ref.grad,
                 1e-6);
  }
}

TEST(CrossEntropy, StridedLogitsAndTargetsEqualTheirCopies) {
  auto base = mul(sample({13, 7}, 32), 3.0);
  auto pairs = tensor::from<std::int64_t>({6, 0, 1, 0, 0, 0, 3, 0, 2, 0, 5, 0, 4, 0, 6, 0, 1, 0, 0, 0, 2, 0, 3, 0, 5, 0},
                                          {13, 2});
  auto targets = pairs.select(1, 0); // stride 2
  for (dtype type : {dtype::float64, dtype::float32}) {
    auto logits = base.to(type).t().contiguous().t(); // [13, 7] with strides [1, 13]
    auto r = cross_entropy(logits, targets);
    auto copied = cross_entropy(logits.contiguous(), targets.contiguous());
    EXPECT_EQ(r.loss.item(), copied.loss.item());
    auto upstream = tensor::full({}, 1.0, type);
    EXPECT_EQ(values(cross_entropy_backward(upstream, logits, targets, r.log_sum_exp)),
              values(cross_entropy_backward(upstream, logits.contiguous(), targets.contiguous(),
                                            copied.log_sum_exp)));
  }
}

/// Causal softmax of `scale x` in float64: x [..., queries, keys], row i of
/// each matrix over its first min(i + 1, keys) elements, 0 after them.
std::vector<double> causal_softmax_reference(const tensor& x, double scale) {
  auto v = values(x);
  const auto queries = x.size(-2), keys = x.size(-1);
  std::vector<double> out(v.size(), 0.0);
  for (std::int64_t r = 0; r < x.numel() / keys; ++r) {
    const auto kept = std::min(r % queries + 1, keys);
    const double* row = v.data() + r * keys;
    double top = -INFINITY;
    for (std::int64_t j = 0; j < kept; ++j)
      top = std::max(top, scale * row[j]);
    double total = 0;
    for (std::int64_t j = 0; j < kept; ++j)
      total += std::exp(scale * row[j] - top);
    for (std::int64_t j = 0; j < kept; ++j)
      out[r * keys + j] = std::exp(scale * row[j] - top) / total;
  }
  return out;
}

/// dL/dx of causal_softmax in float64: scale y (g - <g, y>) row by row.
std::vector<double> causal_softmax_backward_reference(const tensor& x, const tensor& g, double scale) {
  auto y = causal_softmax_reference(x, scale);
  auto gv = values(g);
  const auto keys = x.size(-1);
  std::vector<double> out(y.size());
  for (std::int64_t r = 0; r < x.numel() / keys; ++r) {
    double dot = 0;
    for (std::int64_t j = 0; j < keys; ++j)
      dot += gv[r * keys + j] * y[r * keys + j];
    for (std::int64_t j = 0; j < keys; ++j)
      out[r * keys + j] = scale * y[r * keys + j] * (gv[r * keys + j] - dot);
  }
  return out;
}

// Key lengths around the vector widths and past a 128 block, square and with
// fewer queries than keys (rows then keep fewer than all keys) or more.
TEST(CausalSoftmax, RowsOfEveryLengthMatchTheFloat64Reference) {
  for (std::int64_t keys : {1, 3, 4, 5, 8, 9, 17, 31, 33, 128, 131}) {
    for (std::int64_t queries : {keys, std::int64_t{3}, keys + 2}) {
      SCOPED_TRACE(testing::Message() << queries << " x " << keys);
      auto x = mul(sample({2, queries, keys}, 61), 8.0);
      auto g = sample({2, queries, keys}, 62);
      const double scale = 0.35;
      auto y = causal_softmax(x, scale);
      expect_close(y, causal_softmax_reference(x, scale), 1e-14);
      expect_close(causal_softmax_backward(g, y, scale), causal_softmax_backward_reference(x, g, scale), 1e-13);
      // float32 within 1e-6 (1 + |ref|), as softmax; masked entries exactly 0.
      auto x32 = x.to(dtype::float32);
      auto y32 = causal_softmax(x32, scale);
      expect_close(y32, causal_softmax_reference(x, scale), 1e-6);
      expect_close(causal_softmax_backward(g.to(dtype::float32), y32, scale),
                   causal_softmax_backward_reference(x, g, scale), 1e-6);
      auto v = values(y32);
      for (std::int64_t r = 0; r < 2 * queries; ++r)
        for (std::int64_t j = r % queries + 1; j < keys; ++j)
          ASSERT_EQ(v[r * keys + j], 0.0) << "row " << r << " key " << j;
    }
  }
}

TEST(CausalSoftmax, EqualsSoftmaxOfTheScaledScoresPlusAMinusInfinityMask) {
  // What causal_self_attention computed before: scale, add triu(-inf), softmax.
  auto x = mul(sample({3, 7, 7}, 63), 5.0);
  auto mask = tensor::zeros({7, 7}, dtype::float64);
  for (std::int64_t i = 0; i < 7; ++i)
    for (std::int64_t j = i + 1; j < 7; ++j)
      mask.data<double>()[i * 7 + j] = -INFINITY;
  auto composed = softmax(add(mul(x, 0.5), mask), -1);
  auto fused = causal_softmax(x, 0.5);
  expect_close(fused, values(composed), 1e-15);
  auto g = sample({3, 7, 7}, 64);
  expect_close(causal_softmax_backward(g, fused, 0.5), values(mul(softmax_backward(g, composed, -1), 0.5)), 1e-15);
}

TEST(CausalSoftmax, AStridedInputEqualsItsContiguousCopy) {
  auto base = mul(sample({2, 9, 13}, 65), 4.0);
  for (dtype type : {dtype::float64, dtype::float32}) {
    auto x = base.to(type);
    for (const auto& view : {x.transpose(1, 2), x.narrow(2, 1, 11)}) {
      auto y = causal_softmax(view, 0.25);
      EXPECT_EQ(values(y), values(causal_softmax(view.contiguous(), 0.25)));
      EXPECT_EQ(values(causal_softmax_backward(view, y, 0.25)),
                values(causal_softmax_backward(view.contiguous(), y, 0.25)));
    }
  }
}

TEST(CausalSoftmax, TheComposedDefaultOfOtherBackendsAgrees) {
  // backend::causal_softmax's default (a mask and softmax), as a backend
  // without the fused kernel runs it; what lies under the mask (NaN here) is
  // never read.
  auto x = mul(sample({2, 5, 6}, 66), 3.0);
  auto poisoned = x.clone();
  for (std::int64_t r = 0; r < 10; ++r)
    for (std::int64_t j = r % 5 + 1; j < 6; ++j)
      poisoned.data<double>()[r * 6 + j] = NAN;
  auto& cpu = backend_for(device::cpu());
  auto y = tensor::empty({10, 6}, dtype::float64);
  cpu.backend::causal_softmax(poisoned.view({10, 6}), 5, 0.7, y);
  auto fused = causal_softmax(x, 0.7);
  expect_close(y, values(fused), 1e-15);
  auto g = sample({10, 6}, 67);
  auto poisoned_g = g.clone();
  for (std::int64_t r = 0; r < 10; ++r)
    for (std::int64_t j = r % 5 + 1; j < 6; ++j)
      poisoned_g.data<double>()[r * 6 + j] = NAN;
  auto grad = tensor::empty({10, 6}, dtype::float64);
  cpu.backend::causal_softmax_backward(poisoned_g, fused.view({10, 6}), 5, 0.7, grad);
  expect_close(grad, values(causal_softmax_backward(g.view({2, 5, 6}), fused, 0.7)), 1e-15);
  // Nor does the CPU's own kernel read under the mask, on either path.
  expect_close(causal_softmax(poisoned.view({2, 5, 6}), 0.7), values(fused), 0.0);
  expect_close(causal_softmax_backward(poisoned_g.view({2, 5, 6}), fused, 0.7), values(grad), 1e-15);
}

TEST(CausalSoftmax, NamesBadScalesAndShapes) {
  auto x = sample({3, 3}, 68);
  EXPECT_THAT(test::usage_error_of([&] { (void)causal_softmax(x, 0.0); }),
              HasSubstr("causal_softmax: scale must be positive and finite, got 0"));
  EXPECT_THAT(test::usage_error_of([&] { (void)causal_softmax(x.reshape({9}), 1.0); }),
              HasSubstr("causal_softmax: scores must be [..., queries, keys], got shape [9]"));
  EXPECT_THAT(test::usage_error_of([&] { (void)causal_softmax_backward(x, x.reshape({1, 9}), 1.0); }),
              HasSubstr("causal_softmax_backward: grad shape [3, 3] differs from output shape [1, 9]"));
}

TEST(CrossEntropy, TheComposedDefaultOfOtherBackendsAgrees) {
  // A backend without a fused kernel (backend::cross_entropy's default)
  // gives what the CPU's fused one does, within rounding.
  auto logits = mul(sample({6, 9}, 33), 4.0);
  auto targets = tensor::from<std::int64_t>({8, 0, 3, 3, 1, 7}, {6});
  auto& cpu = backend_for(device::cpu());
  auto loss = tensor::empty({}, dtype::float64);
  auto lse = tensor::empty({6}, dtype::float64);
  cpu.backend::cross_entropy(logits, targets, loss, lse);
  auto fused = cross_entropy(logits, targets);
  EXPECT_NEAR(loss.item(), fused.loss.item(), 1e-14);
  expect_close(lse, fused.log_sum_exp, 1e-14);
  auto upstream = tensor::full({}, 2.0, dtype::float64);
  auto grad = tensor::empty({6, 9}, dtype::float64);
  cpu.backend::cross_entropy_backward(upstream, logits, targets, fused.log_sum_exp, grad);
  expect_close(grad, cross_entropy_backward(upstream, logits, targets, fused.log_sum_exp), 1e-14);
}

TEST(CrossEntropy, NamesBadTargetsAndShapes) {
  auto logits = sample({2, 3}, 34);
  EXPECT_THAT(test::usage_error_of([&] { (void)cross_entropy(logits, tensor::from<std::int64_t>({1, 3}, {2})); }),
              HasSubstr("cross_entropy: target 3 at position 1 is outside [0, 3)"));
  EXPECT_THAT(test::usage_error_of([&] { (void)cross_entropy(logits, tensor::from<std::int64_t>({0, 0, 0}, {3})); }),
              HasSubstr("cross_entropy: targets must be [2] for logits [2, 3], got shape [3]"));
  EXPECT_THAT(test::usage_error_of([&] { (void)cross_entropy(logits.reshape({6}), tensor::from<std::int64_t>({0}, {1})); }),
              HasSubstr("cross_entropy: logits must be [n, classes], got shape [6]"));
  EXPECT_THAT(test::usage_error_of([&] { (void)cross_entropy(logits, tensor::from<double>({0, 1}, {2})); }),
              HasSubstr("cross_entropy: targets must be int64, got float64"));
}

} // namespace
} // namespace troupe
