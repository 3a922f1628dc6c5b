// Convolution, pooling, layer norm and embedding bags against direct
// float64 loops, with gradients checked by finite differences.
#include <cmath>

#include "test_util.hpp"

namespace troupe {
namespace {

using test::expect_close;
using test::make;
using test::sample;
using test::values;
using testing::HasSubstr;

/// Direct nested-loop convolution (NCHW, zero padding).
std::vector<double> direct_conv(const tensor& x, const tensor& w, const tensor& b,
                                std::int64_t stride, std::int64_t pad) {
  const auto n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const auto o = w.size(0), kh = w.size(2), kw = w.size(3);
  const auto oh = (h + 2 * pad - kh) / stride + 1;
  const auto ow = (wd + 2 * pad - kw) / stride + 1;
  std::vector<double> out;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t f = 0; f < o; ++f)
      for (std::int64_t y = 0; y < oh; ++y)
        for (std::int64_t z = 0; z < ow; ++z) {
          double s = b.defined() ? b.at({f}) : 0.0;
          for (std::int64_t ch = 0; ch < c; ++ch)
            for (std::int64_t p = 0; p < kh; ++p)
              for (std::int64_t q = 0; q < kw; ++q) {
                auto iy = y * stride - pad + p;
                auto ix = z * stride - pad + q;
                if (iy >= 0 && iy < h && ix >= 0 && ix < wd)
                  s += x.at({i, ch, iy, ix}) * w.at({f, ch, p, q});
              }
          out.push_back(s);
        }
  return out;
}

TEST(Conv2d, MatchesTheDirectConvolutionForStridesAndPadding) {
  auto x = sample({2, 3, 7, 6}, 1);
  auto w = sample({4, 3, 3, 2}, 2);
  auto b = sample({4}, 3);
  for (std::int64_t stride : {1, 2})
    for (std::int64_t pad : {0, 1, 2}) {
      auto y = conv2d(x, w, b, {stride, pad});
      const auto oh = (7 + 2 * pad - 3) / stride + 1;
      const auto ow = (6 + 2 * pad - 2) / stride + 1;
      EXPECT_EQ(y.shape(), (dims{2, 4, oh, ow}));
      expect_close(y, direct_conv(x, w, b, stride, pad), 1e-13);
    }
  expect_close(conv2d(x, w, tensor{}), direct_conv(x, w, tensor{}, 1, 0), 1e-13);
  auto f32 = conv2d(x.to(dtype::float32), w.to(dtype::float32), b.to(dtype::float32), {2, 1});
  expect_close(f32, direct_conv(x, w, b, 2, 1), 1e-5);
}

TEST(Conv2d, BackwardMatchesFiniteDifferences) {
  auto x = sample({2, 2, 5, 4}, 4);
  auto w = sample({3, 2, 3, 3}, 5);
  auto b = sample({3}, 6);
  conv2d_options options{2, 1};
  auto g = sample(conv2d(x, w, b, options).shape(), 7);
  auto grads = conv2d_backward(g, x, w, true, options);
  expect_close(grads.input,
               test::numeric_gradient(
                   [&](const tensor& v) { return test::weighted_sum(conv2d(v, w, b, options), g); }, x),
               1e-7);
  expect_close(grads.weight,
               test::numeric_gradient(
                   [&](const tensor& v) { return test::weighted_sum(conv2d(x, v, b, options), g); }, w),
               1e-7);
  expect_close(grads.bias,
               test::numeric_gradient(
                   [&](const tensor& v) { return test::weighted_sum(conv2d(x, w, v, options), g); }, b),
               1e-7);
  EXPECT_FALSE(conv2d_backward(g, x, w, false, options).bias.defined());
}

// im2col and col2im work a row of columns at a time, from the range of
// output columns that reads inside the image: strides 1 to 3 and padding
// up to wider than the kernel (whole rows and columns of padding), on
// contiguous input and on a transposed view, in float64 and float32.
TEST(Conv2d, ForwardAndGradientsHoldForEveryStrideAndPadding) {
  auto contiguous = sample({2, 2, 6, 5}, 20);
  auto transposed = sample({2, 2, 5, 6}, 21).transpose(2, 3); // [2, 2, 6, 5], not contiguous
  auto w = sample({3, 2, 3, 2}, 22);
  for (const auto& x : {contiguous, transposed})
    for (std::int64_t stride : {1, 2, 3})
      for (std::int64_t pad : {0, 1, 3}) {
        SCOPED_TRACE(::testing::Message() << "stride " << stride << " padding " << pad
                                          << (x.is_contiguous() ? "" : ", transposed input"));
        const conv2d_options options{stride, pad};
        auto y = conv2d(x, w, tensor{}, options);
        expect_close(y, direct_conv(x, w, tensor{}, stride, pad), 1e-13);
        expect_close(conv2d(x.to(dtype::float32), w.to(dtype::float32), tensor{}, options),
                     direct_conv(x, w, tensor{}, stride, pad), 1e-5);
        auto g = sample(y.shape(), 23);
        auto grads = conv2d_backward(g, x, w, false, options);
        // The convolution is linear in each operand: central differences
        // are exact up to rounding.
        expect_close(grads.input,
                     test::numeric_gradient(
                       [&](const tensor& v) { return test::weighted_sum(conv2d(v, w, tensor{}, options), g); },
                       x.contiguous()),
                     1e-7);
        expect_close(grads.weight,
                     test::numeric_gradient(
                       [&](const tensor& v) { return test::weighted_sum(conv2d(x, v, tensor{}, options), g); }, w),
                     1e-7);
      }
}

TEST(Conv2d, WithoutTheInputsGradientOnlyTheWeightsIsComputed) {
  auto x = sample({2, 3, 6, 5}, 30);
  auto w = sample({4, 3, 3, 3}, 31);
  auto g = sample(conv2d(x, w, tensor{}, {2, 1}).shape(), 32);
  auto both = conv2d_backward(g, x, w, true, {2, 1});
  auto weight_only = conv2d_backward(g, x, w, true, {2, 1}, /*input_grad=*/false);
  EXPECT_FALSE(weight_only.input.defined());
  expect_close(weight_only.weight, both.weight, 0.0);
  expect_close(weight_only.bias, both.bias, 0.0);
}

TEST(Conv2d, ChannelMismatchNamesTheOpAndShapes) {
  auto message = test::usage_error_of(
      [] { (void)conv2d(tensor::zeros({1, 3, 5, 5}), tensor::zeros({2, 4, 3, 3}), tensor{}); });
  EXPECT_THAT(message, HasSubstr("conv2d"));
  EXPECT_THAT(message, HasSubstr("[1, 3, 5, 5]"));
  EXPECT_THAT(message, HasSubstr("[2, 4, 3, 3]"));
}

TEST(MaxPool2d, OutputsWindowMaximaAndFlatPlaneIndices) {
  auto x = make({1, 2, 3, 4,   //
                 5, 6, 7, 8,   //
                 9, 1, 2, 3,   //
                 4, 5, 6, 20}, //
                {1, 1, 4, 4});
  auto [out, indices] = max_pool2d(x);
  expect_close(out, std::vector<double>{6, 8, 9, 20}, 0);
  EXPECT_EQ(indices.to_vector<std::int64_t>(), (std::vector<std::int64_t>{5, 7, 8, 15}));
  auto overlapping = max_pool2d(x, {3, 1});
  expect_close(overlapping.output, std::vector<double>{9, 8, 9, 20}, 0);

  auto g = make({1, 2, 3, 4}, {1, 1, 2, 2});
  auto gi = max_pool2d_backward(g, indices, x.shape());
  std::vector<double> expected(16, 0.0);
  expected[5] = 1;
  expected[7] = 2;
  expected[8] = 3;
  expected[15] = 4;
  expect_close(gi, expected, 0);
}

// The first maximum in window order wins, and NaN counts as a maximum:
// the first NaN of a window wins over every number and every later NaN.
TEST(MaxPool2d, TheFirstMaximumOrNanOfAWindowWins) {
  const double nan = std::nan("");
  for (auto type : {dtype::float64, dtype::float32}) {
    SCOPED_TRACE(fmt::format("{}", type));
    auto x = make({3, 3, 1, 9,     //
                   3, 2, nan, 5,   //
                   7, nan, 4, 4,   //
                   nan, 8, 4, 1},  //
                  {1, 1, 4, 4})
               .to(type);
    auto [out, indices] = max_pool2d(x);
    auto got = values(out);
    EXPECT_EQ(got[0], 3);
    EXPECT_TRUE(std::isnan(got[1]));
    EXPECT_TRUE(std::isnan(got[2]));
    EXPECT_EQ(got[3], 4);
    // Window 0 ties at 3 (positions 0, 1, 4): the first. Window 1's NaN
    // beats the 9 before it. Window 2 has NaNs at 9 and 12: the first.
    // Window 3 ties at 4 (10, 11, 14): the first.
    EXPECT_EQ(indices.to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 6, 9, 10}));
  }
}

TEST(MaxPool2d, BackwardMatchesFiniteDifferencesOnEachPlane) {
  auto x = sample({2, 3, 6, 5}, 8);
  auto g = sample(max_pool2d(x, {2, 2}).output.shape(), 9);
  auto result = max_pool2d(x, {2, 2});
  expect_close(max_pool2d_backward(g, result.indices, x.shape()),
               test::numeric_gradient(
                   [&](const tensor& v) { return test::weighted_sum(max_pool2d(v, {2, 2}).output, g); },
                   x),
               1e-7);
}

TEST(LayerNorm, NormalisesTheLastDimension) {
  auto x = sample({3, 2, 5}, 10);
  auto w = sample({5}, 11);
  auto b = sample({5}, 12);
  auto r = layer_norm(x, w, b, 1e-5);
  EXPECT_EQ(r.mean.shape(), (dims{3, 2}));
  auto xv = values(x), wv = values(w), bv = values(b);
  std::vector<double> expected;
  for (int row = 0; row < 6; ++row) {
    double m = 0, v = 0;
    for (int j = 0; j < 5; ++j)
      m += xv[row * 5 + j] / 5;
    for (int j = 0; j < 5; ++j)
      v += (xv[row * 5 + j] - m) * (xv[row * 5 + j] - m) / 5;
    EXPECT_NEAR(values(r.mean)[row], m, 1e-14);
    EXPECT_NEAR(values(r.rstd)[row], 1 / std::sqrt(v + 1e-5), 1e-12);
    for (int j = 0; j < 5; ++j)
      expected.push_back((xv[row * 5 + j] - m) / std::sqrt(v + 1e-5) * wv[j] + bv[j]);
  }
  expect_close(r.output, expected, 1e-12);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  auto x = sample({4, 6}, 13);
  auto w = sample({6}, 14);
  auto b = sample({6}, 15);
  auto g = sample({4, 6}, 16);
  auto saved = layer_norm(x, w, b);
  auto grads = layer_norm_backward(g, x, saved, w);
  auto loss = [&](const tensor& xv, const tensor& wv, const tensor& bv) {
    return test::weighted_sum(layer_norm(xv, wv, bv).output, g);
  };
  expect_close(grads.input,
               test::numeric_gradient([&](const tensor& v) { return loss(v, w, b); }, x), 1e-6);
  expect_close(grads.weight,
               test::numeric_gradient([&](const tensor& v) { return loss(x, v, b); }, w), 1e-6);
  expect_close(grads.bias,
               test::numeric_gradient([&](const tensor& v) { return loss(x, w, v); }, b), 1e-6);
  // Without an affine weight the input gradient is that of plain normalisation.
  auto plain = layer_norm_backward(g, x, layer_norm(x, tensor{}, tensor{}), tensor{});
  expect_close(plain.input,
               test::numeric_gradient(
                   [&](const tensor& v) { return loss(v, tensor{}, tensor{}); }, x),
               1e-6);
}

/// Layer norm of [rows, d] and its gradients, in float64 by two passes.
struct layer_norm_reference {
  std::vector<double> output, mean, rstd, grad_input, grad_weight, grad_bias;
};

layer_norm_reference reference_layer_norm(const tensor& x, const tensor& w, const tensor& b,
                                          const tensor& g, double eps) {
  const auto d = x.size(-1);
  const auto rows = x.numel() / d;
  auto xv = values(x), gv = values(g);
  auto wv = w.defined() ? values(w) : std::vector<double>(d, 1.0);
  auto bv = b.defined() ? values(b) : std::vector<double>(d, 0.0);
  layer_norm_reference ref;
  ref.grad_weight.assign(d, 0.0);
  ref.grad_bias.assign(d, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double* xr = xv.data() + r * d;
    const double* gr = gv.data() + r * d;
    double m = 0, v = 0;
    for (std::int64_t j = 0; j < d; ++j)
      m += xr[j];
    m /= d;
    for (std::int64_t j = 0; j < d; ++j)
      v += (xr[j] - m) * (xr[j] - m);
    const double s = 1 / std::sqrt(v / d + eps);
    ref.mean.push_back(m);
    ref.rstd.push_back(s);
    double mean_g = 0, mean_gx = 0;
    for (std::int64_t j = 0; j < d; ++j) {
      const double xhat = (xr[j] - m) * s;
      ref.output.push_back(xhat * wv[j] + bv[j]);
      mean_g += gr[j] * wv[j] / d;
      mean_gx += gr[j] * wv[j] * xhat / d;
      ref.grad_weight[j] += gr[j] * xhat;
      ref.grad_bias[j] += gr[j];
    }
    for (std::int64_t j = 0; j < d; ++j)
      ref.grad_input.push_back(s * (gr[j] * wv[j] - mean_g - (xr[j] - m) * s * mean_gx));
  }
  return ref;
}

// Row lengths around the vector widths (4 doubles, 8 floats, four lane sets
// of Welford, blocks of 128), each affine case, in float64 and float32.
TEST(LayerNorm, RowsOfEveryLengthMatchTheFloat64Reference) {
  for (std::int64_t d : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 86, 129, 256, 1001}) {
    SCOPED_TRACE(d);
    auto x = add(mul(sample({5, d}, 20), 3.0), 0.5);
    auto w = sample({d}, 21);
    auto b = sample({d}, 22);
    auto g = sample({5, d}, 23);
    for (int affine = 0; affine < 4; ++affine) {
      SCOPED_TRACE(affine);
      const tensor wa = (affine & 1) != 0 ? w : tensor{};
      const tensor ba = (affine & 2) != 0 ? b : tensor{};
      auto ref = reference_layer_norm(x, wa, ba, g, 1e-5);
      auto r = layer_norm(x, wa, ba, 1e-5);
      expect_close(r.output, ref.output, 1e-13);
      expect_close(r.mean, ref.mean, 1e-14);
      expect_close(r.rstd, ref.rstd, 1e-13);
      auto grads = layer_norm_backward(g, x, r, wa);
      expect_close(grads.input, ref.grad_input, 1e-12);
      expect_close(grads.weight, ref.grad_weight, 1e-13);
      expect_close(grads.bias, ref.grad_bias, 1e-14);
      // float32: within 1e-5 (1 + |ref|) of the float64 results (d = 1
      // normalises to zero exactly; rstd carries a few ulp, dx the
      // cancellation in gxhat - mean - xhat mean(gxhat xhat)).
      auto to32 = [](const tensor& t) { return t.defined() ? t.to(dtype::float32) : tensor{}; };
      auto r32 = layer_norm(to32(x), to32(wa), to32(ba), 1e-5);
      expect_close(r32.output, ref.output, 1e-5);
      expect_close(r32.mean, ref.mean, 1e-6);
      expect_close(r32.rstd, ref.rstd, 1e-5);
      auto grads32 = layer_norm_backward(to32(g), to32(x), r32, to32(wa));
      expect_close(grads32.input, ref.grad_input, 1e-5);
      expect_close(grads32.weight, ref.grad_weight, 1e-5);
      expect_close(grads32.bias, ref.grad_bias, 1e-5);
    }
  }
}

TEST(LayerNorm, LargeMeansAndAnOutlierLoseNoAccuracy) {
  // Mean 1e4 with deviations of 1 (E[x^2] - E[x]^2 would lose 8 of float64's
  // 16 digits), and rows whose first element is 100 standard deviations off.
  for (std::int64_t d : {37, 256}) {
    auto x = add(sample({4, d}, 24), 1e4);
    auto outlier = sample({4, d}, 25);
    for (std::int64_t r = 0; r < 4; ++r)
      outlier.select(0, r).narrow(0, 0, 1).fill(100.0);
    for (const auto& rows : {x, outlier}) {
      auto ref = reference_layer_norm(rows, tensor{}, tensor{}, tensor::zeros(rows.shape()), 0.0);
      auto r = layer_norm(rows, tensor{}, tensor{}, 0.0);
      expect_close(r.rstd, ref.rstd, 1e-10);
      expect_close(r.output, ref.output, 1e-10);
      // float32 on the float32-rounded input, against the float64
      // normalisation of that same input: rstd within 1e-5; the output
      // within 1e-3, since x - mean cannot beat float32's rounding of the
      // mean (half an ulp of 1e4 over a spread of 0.58 is 8.5e-4).
      auto rows32 = rows.to(dtype::float32);
      auto ref32 = reference_layer_norm(rows32.to(dtype::float64), tensor{}, tensor{}, tensor::zeros(rows.shape()), 0.0);
      auto r32 = layer_norm(rows32, tensor{}, tensor{}, 0.0);
      expect_close(r32.rstd, ref32.rstd, 1e-5);
      expect_close(r32.output, ref32.output, 1e-3);
    }
  }
}

TEST(LayerNorm, AStridedInputEqualsItsContiguousCopy) {
  // Transposed input and gradient, and a weight read every other element:
  // bitwise what their contiguous copies give.
  auto x = sample({19, 6}, 26);
  auto w = sample({38}, 27);
  auto b = sample({19}, 28);
  auto g = sample({19, 6}, 29);
  for (dtype type : {dtype::float64, dtype::float32}) {
    auto xt = x.to(type).t();
    auto gt = g.to(type).t();
    auto wv = w.to(type).view({19, 2}).select(1, 0);
    auto bt = b.to(type);
    auto strided = layer_norm(xt, wv, bt);
    auto copied = layer_norm(xt.contiguous(), wv.contiguous(), bt);
    EXPECT_EQ(values(strided.output), values(copied.output));
    auto grads = layer_norm_backward(gt, xt, strided, wv);
    auto grads_copied = layer_norm_backward(gt.contiguous(), xt.contiguous(), copied, wv.contiguous());
    EXPECT_EQ(values(grads.input), values(grads_copied.input));
    EXPECT_EQ(values(grads.weight), values(grads_copied.weight));
    EXPECT_EQ(values(grads.bias), values(grads_copied.bias));
  }
}

TEST(EmbeddingBag, SumsAndMeansBagsWithAnEmptyBag) {
  auto weight = make({1, 2, 10, 20, 100, 200}, {3, 2});
  auto indices = tensor::from<std::int64_t>({0, 2, 1, 2, 2}, {5});
  auto offsets = tensor::from<std::int64_t>({0, 2, 2}, {3}); // bag 1 is empty
  expect_close(embedding_bag(weight, indices, offsets, bag_mode::sum),
               std::vector<double>{101, 202, 0, 0, 210, 420}, 0);
  expect_close(embedding_bag(weight, indices, offsets, bag_mode::mean),
               std::vector<double>{50.5, 101, 0, 0, 70, 140}, 1e-15);
}

TEST(EmbeddingBag, BackwardMatchesFiniteDifferences) {
  auto weight = sample({4, 3}, 17);
  auto indices = tensor::from<std::int64_t>({3, 0, 3, 1, 2, 2}, {6});
  auto offsets = tensor::from<std::int64_t>({0, 3, 3, 4}, {4});
  for (auto mode : {bag_mode::sum, bag_mode::mean}) {
    auto g = sample({4, 3}, 18);
    auto numeric = test::numeric_gradient(
        [&](const tensor& v) { return test::weighted_sum(embedding_bag(v, indices, offsets, mode), g); },
        weight);
    expect_close(embedding_bag_backward(g, indices, offsets, mode, 4), numeric, 1e-7);
  }
}

TEST(EmbeddingBag, RejectsBadOffsetsAndIndices) {
  auto weight = tensor::zeros({3, 2});
  auto idx = tensor::from<std::int64_t>({0, 1, 2}, {3});
  auto off = [](std::vector<std::int64_t> v) {
    return tensor::from(v, {static_cast<std::int64_t>(v.size())});
  };
  EXPECT_THAT(test::usage_error_of(
                  [&] { (void)embedding_bag(weight, idx, off({1, 2}), bag_mode::sum); }),
              HasSubstr("embedding_bag: offsets must start at 0"));
  EXPECT_THAT(test::usage_error_of(
                  [&] { (void)embedding_bag(weight, idx, off({0, 2, 1}), bag_mode::sum); }),
              HasSubstr("decrease"));
  EXPECT_THAT(test::usage_error_of(
                  [&] { (void)embedding_bag(weight, idx, off({0, 4}), bag_mode::sum); }),
              HasSubstr("exceeds"));
  EXPECT_THAT(test::usage_error_of([&] {
                (void)embedding_bag(weight, tensor::from<std::int64_t>({0, 3}, {2}), off({0}),
                                    bag_mode::sum);
              }),
              HasSubstr("embedding_bag: index 3"));
  EXPECT_THAT(test::usage_error_of([&] {
                (void)embedding_bag(weight, idx, tensor::from<std::int32_t>({0}, {1}), bag_mode::sum);
              }),
              HasSubstr("offsets must be int64"));
}

} // namespace
} // namespace troupe
