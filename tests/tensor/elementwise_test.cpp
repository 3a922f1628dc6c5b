// Elementwise ops against float64 references computed here, on contiguous,
// strided and broadcast operands.
#include <cmath>
#include <numbers>
#include <string_view>

#include "test_util.hpp"
#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/cuda.hpp"

namespace troupe {
namespace {

using test::expect_close;
using test::make;
using test::sample;
using test::values;
using testing::HasSubstr;

std::vector<double> map(const tensor& x, double (*f)(double)) {
  auto v = values(x);
  for (auto& e : v)
    e = f(e);
  return v;
}

double gelu_reference(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
}

TEST(Elementwise, UnaryMathMatchesTheFloat64Reference) {
  for (auto type : {dtype::float64, dtype::float32}) {
    const double tol = type == dtype::float32 ? 1e-6 : 1e-14;
    auto x = sample({3, 5}, 1, type);
    auto positive = add(abs(x), 0.5);
    expect_close(exp(x), map(x, [](double v) { return std::exp(v); }), tol);
    expect_close(log(positive), map(positive, [](double v) { return std::log(v); }), tol);
    expect_close(tanh(x), map(x, [](double v) { return std::tanh(v); }), tol);
    expect_close(sqrt(positive), map(positive, [](double v) { return std::sqrt(v); }), tol);
    expect_close(pow(positive, 1.5), map(positive, [](double v) { return std::pow(v, 1.5); }), tol);
    expect_close(abs(x), map(x, [](double v) { return std::abs(v); }), tol);
    expect_close(relu(x), map(x, [](double v) { return v > 0 ? v : 0.0; }), tol);
    expect_close(gelu(x), map(x, gelu_reference), tol);
    expect_close(sigmoid(x), map(x, [](double v) { return 1 / (1 + std::exp(-v)); }), tol);
    expect_close(neg(x), map(x, [](double v) { return -v; }), tol);
    expect_close(mul(x, 2.5), map(x, [](double v) { return 2.5 * v; }), tol);
    EXPECT_EQ(exp(x).type(), type);
  }
}

TEST(Elementwise, GeluIsExactNotTheTanhApproximation) {
  // At x = 1 the erf form gives 0.841344746..., the tanh form 0.841191990...
  EXPECT_NEAR(gelu(make({1.0}, {1})).item(), 0.8413447460685429, 1e-15);
}

/// PyTorch's approximate='tanh' GELU and its derivative.
double gelu_tanh_reference(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_tanh_derivative_reference(double x) {
  // 1 - tanh(u)^2 as 1 / cosh(u)^2, which does not cancel for large u.
  const double k = std::sqrt(2.0 / std::numbers::pi);
  const double u = k * (x + 0.044715 * x * x * x);
  const double c = std::cosh(u);
  return 0.5 * (1.0 + std::tanh(u)) + 0.5 * x / (c * c) * k * (1.0 + 3 * 0.044715 * x * x);
}

TEST(Elementwise, GeluTanhIsPyTorchsApproximation) {
  // At x = 1 the tanh form gives 0.841191990..., the erf form 0.841344746...
  EXPECT_NEAR(gelu(make({1.0}, {1}), gelu_approximation::tanh).item(), 0.8411919906082768, 1e-15);
  // Over the whole range, the special values and every length of the last
  // partial vector: float64 within 8 ulp (1 + |ref|), float32 within 8 of
  // its own, of the float64 reference (computed on the rounded input).
  std::vector<double> inputs{-1000, -100, -30, -10, -5.5, -1, -1e-3, -1e-30, 0, 1e-30, 1e-3, 1, 5.5, 10, 30, 100, 1000};
  for (int i = 0; i <= 997; ++i)
    inputs.push_back(-12.0 + 24.0 * i / 997.0);
  for (auto type : {dtype::float32, dtype::float64}) {
    const double ulp = type == dtype::float32 ? 0x1p-23 : 0x1p-52;
    auto x = tensor::from(inputs, {static_cast<std::int64_t>(inputs.size())}).to(type);
    auto grad = tensor::full(x.shape(), 0.75, type);
    auto y = values(gelu(x, gelu_approximation::tanh));
    auto dy = values(gelu_backward(grad, x, gelu_approximation::tanh));
    auto xs = values(x);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double want = gelu_tanh_reference(xs[i]);
      const double want_dy = 0.75 * gelu_tanh_derivative_reference(xs[i]);
      EXPECT_LE(std::abs(y[i] - want), 8 * ulp * (1.0 + std::abs(want))) << "gelu_tanh(" << xs[i] << ")";
      EXPECT_LE(std::abs(dy[i] - want_dy), 8 * ulp * (1.0 + std::abs(want_dy))) << "gelu_tanh'(" << xs[i] << ")";
    }
    // A strided view goes through the same function: its copy's bits.
    auto strided = x.narrow(0, 1, 1000).view({10, 100}).t();
    EXPECT_EQ(values(gelu(strided, gelu_approximation::tanh)),
              values(gelu(strided.contiguous(), gelu_approximation::tanh)));
    auto nan = tensor::full({9}, std::nan(""), type);
    for (double v : values(gelu(nan, gelu_approximation::tanh)))
      EXPECT_TRUE(std::isnan(v));
  }
}

TEST(Elementwise, BinaryOpsBroadcastLikeNumPy) {
  auto a = sample({2, 3, 4}, 2);
  auto b = sample({3, 1}, 3);
  auto av = values(a);
  auto bv = values(b);
  std::vector<double> sum_ref, sub_ref, mul_ref, div_ref, max_ref, gt_ref;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) {
        double x = av[(i * 3 + j) * 4 + k];
        double y = bv[j];
        sum_ref.push_back(x + y);
        sub_ref.push_back(x - y);
        mul_ref.push_back(x * y);
        div_ref.push_back(x / y);
        max_ref.push_back(std::max(x, y));
        gt_ref.push_back(x > y ? 1.0 : 0.0);
      }
  EXPECT_EQ(add(a, b).shape(), (dims{2, 3, 4}));
  expect_close(a + b, sum_ref, 1e-15);
  expect_close(a - b, sub_ref, 1e-15);
  expect_close(a * b, mul_ref, 1e-15);
  expect_close(a / b, div_ref, 1e-15);
  expect_close(maximum(a, b), max_ref, 0);
  expect_close(greater(a, b), gt_ref, 0);
  // Broadcasting is symmetric.
  expect_close(b + a, sum_ref, 1e-15);
}

TEST(Elementwise, StridedAndTransposedOperandsAreReadThroughTheirStrides) {
  auto base = sample({4, 6}, 4);
  auto t = base.t();                   // [6, 4], strides [1, 6]
  auto s = base.slice(1, 0, 6, 2);     // [4, 3], strides [6, 2]
  auto tc = t.contiguous();
  auto sc = s.contiguous();
  EXPECT_EQ(values(exp(t)), values(exp(tc)));
  EXPECT_EQ(values(add(s, s)), values(add(sc, sc)));
  EXPECT_EQ(values(mul(t, tc)), values(mul(tc, tc)));
}

// exp, tanh, sigmoid, GELU and its gradient run SLEEF's vector functions
// where the CPU has AVX2 (cpu_vector_math.hpp), glibc's elsewhere or with
// TROUPE_VECTOR_MATH=off: either way within a few ulps of a float64
// reference, over the whole range and at the special values.
TEST(Elementwise, TranscendentalsAgreeWithAFloat64ReferenceEverywhere) {
  std::vector<double> inputs{-1000, -100, -89, -20, -10, -5.5, -1, -1e-3, -1e-30, 0, 1e-30, 1e-3, 1, 5.5, 10, 20,
                             88, 89, 100, 1000};
  for (int i = 0; i <= 1000; ++i)
    inputs.push_back(-12.0 + 24.0 * i / 1000.0);
  const double pdf_scale = std::numbers::inv_sqrtpi / std::numbers::sqrt2;
  auto reference = [&](std::string_view op, double x) {
    const double cdf = 0.5 * (1.0 + std::erf(x / std::numbers::sqrt2));
    if (op == "exp")
      return std::exp(x);
    if (op == "tanh")
      return std::tanh(x);
    if (op == "sigmoid")
      return 1.0 / (1.0 + std::exp(-x));
    if (op == "gelu")
      return x * cdf;
    return 0.75 * (cdf + x * std::exp(-0.5 * x * x) * pdf_scale); // gelu_backward with grad 0.75
  };
  for (auto type : {dtype::float32, dtype::float64}) {
    const double ulp = type == dtype::float32 ? 0x1p-23 : 0x1p-52;
    auto x = tensor::from(inputs, {static_cast<std::int64_t>(inputs.size())}).to(type);
    auto grad = tensor::full(x.shape(), 0.75, type);
    const std::pair<const char*, tensor> results[] = {
      {"exp", exp(x)}, {"tanh", tanh(x)}, {"sigmoid", sigmoid(x)}, {"gelu", gelu(x)},
      {"gelu_backward", gelu_backward(grad, x)}};
    for (const auto& [op, y] : results) {
      auto got = values(y);
      auto typed_inputs = values(x);
      for (std::size_t i = 0; i < got.size(); ++i) {
        // The reference as the type holds it (float32's exp(89) is inf).
        double want = reference(op, typed_inputs[i]);
        if (type == dtype::float32)
          want = static_cast<double>(static_cast<float>(want));
        if (std::isinf(want)) {
          EXPECT_EQ(got[i], want) << op << "(" << typed_inputs[i] << ") " << name_of(type);
          continue;
        }
        EXPECT_LE(std::abs(got[i] - want), 8 * ulp * (1.0 + std::abs(want)))
          << op << "(" << typed_inputs[i] << ") = " << got[i] << ", want " << want << " " << name_of(type);
      }
    }
    // NaN in, NaN out.
    auto nan = tensor::full({9}, std::nan(""), type);
    for (const auto& y : {exp(nan), tanh(nan), sigmoid(nan), gelu(nan), gelu_backward(grad.slice(0, 0, 9), nan)})
      for (double v : values(y))
        EXPECT_TRUE(std::isnan(v)) << name_of(type);
  }
}

TEST(Elementwise, AnElementsResultDoesNotDependOnTheArraysLength) {
  // A micro-batch computes what the whole batch does: the last partial
  // vector of the vector path gives the same bits as a full one.
  auto x = mul(sample({37}, 5, dtype::float32), 4.0);
  auto head = x.slice(0, 0, 5).contiguous();
  for (auto f : {+[](const tensor& t) { return gelu(t); }, +[](const tensor& t) { return exp(t); },
                 +[](const tensor& t) { return tanh(t); }, +[](const tensor& t) { return sigmoid(t); },
                 +[](const tensor& t) { return gelu(t, gelu_approximation::tanh); }}) {
    auto all = values(f(x));
    auto part = values(f(head));
    EXPECT_EQ(part, std::vector<double>(all.begin(), all.begin() + 5));
  }
}

TEST(Elementwise, IntegerArithmeticForAddSubMul) {
  auto a = tensor::from<std::int64_t>({1, 2, 3}, {3});
  auto b = tensor::from<std::int64_t>({10, 20, 30}, {3});
  EXPECT_EQ((a + b).to_vector<std::int64_t>(), (std::vector<std::int64_t>{11, 22, 33}));
  EXPECT_EQ((b - a).to_vector<std::int64_t>(), (std::vector<std::int64_t>{9, 18, 27}));
  EXPECT_EQ((a * b).to_vector<std::int64_t>(), (std::vector<std::int64_t>{10, 40, 90}));
  auto c = tensor::from<std::int32_t>({1, -2}, {2});
  EXPECT_EQ((c + c).to_vector<std::int32_t>(), (std::vector<std::int32_t>{2, -4}));
  EXPECT_THAT(test::usage_error_of([&] { (void)exp(a); }), HasSubstr("exp: expected float32"));
  EXPECT_THAT(test::usage_error_of([&] { (void)div(a, b); }), HasSubstr("div"));
}

TEST(Elementwise, MixedDtypesAreAUsageErrorNamingBoth) {
  auto a = tensor::zeros({2}, dtype::float32);
  auto b = tensor::zeros({2}, dtype::float64);
  auto message = test::usage_error_of([&] { (void)add(a, b); });
  EXPECT_THAT(message, HasSubstr("add"));
  EXPECT_THAT(message, HasSubstr("float32"));
  EXPECT_THAT(message, HasSubstr("float64"));
}

TEST(Elementwise, IncompatibleShapesNameTheOpAndShapes) {
  auto message = test::usage_error_of([] { (void)mul(tensor::zeros({2, 3}), tensor::zeros({4})); });
  EXPECT_THAT(message, HasSubstr("mul"));
  EXPECT_THAT(message, HasSubstr("[2, 3]"));
  EXPECT_THAT(message, HasSubstr("[4]"));
  EXPECT_EQ(broadcast_shapes({5, 1, 3}, {4, 1}), (dims{5, 4, 3}));
}

TEST(Elementwise, InPlaceAddAndScaleWriteThroughViews) {
  auto a = sample({3, 4}, 5);
  auto before = values(a);
  auto row = sample({4}, 6);
  add_(a, row, -0.5);
  auto rv = values(row);
  std::vector<double> expected;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      expected.push_back(before[i * 4 + j] - 0.5 * rv[j]);
  expect_close(a, expected, 1e-15);

  auto column = a.select(1, 2); // strided view into a
  mul_(column, 2.0);
  for (int i = 0; i < 3; ++i)
    EXPECT_DOUBLE_EQ(a.at({i, 2}), 2.0 * expected[i * 4 + 2]);
  EXPECT_THAT(test::usage_error_of([&] { add_(row, a); }), HasSubstr("add_"));
}

TEST(Elementwise, WhereSelectsAndBroadcasts) {
  auto cond = tensor::from<std::uint8_t>({1, 0, 1}, {3});
  auto a = make({1, 2, 3, 4, 5, 6}, {2, 3});
  auto b = make({-1}, {1});
  expect_close(where(cond, a, b), std::vector<double>{1, -1, 3, 4, -1, 6}, 0);
}

TEST(Elementwise, FusedBackwardsMatchFiniteDifferences) {
  auto x = sample({7}, 7);
  auto g = sample({7}, 8);
  auto check = [&](auto forward, const tensor& fused) {
    auto numeric = test::numeric_gradient(
        [&](const tensor& v) { return test::weighted_sum(forward(v), g); }, x);
    expect_close(fused, numeric, 1e-7);
  };
  check(relu, relu_backward(g, x));
  check([](const tensor& v) { return gelu(v); }, gelu_backward(g, x));
  check([](const tensor& v) { return gelu(v, gelu_approximation::tanh); },
        gelu_backward(g, x, gelu_approximation::tanh));
  check(sigmoid, sigmoid_backward(g, sigmoid(x)));
  check(tanh, tanh_backward(g, tanh(x)));
}

TEST(Elementwise, SumToReversesBroadcasting) {
  auto g = sample({2, 3, 4}, 9);
  auto reduced = sum_to(g, {3, 1});
  EXPECT_EQ(reduced.shape(), (dims{3, 1}));
  auto gv = values(g);
  for (int j = 0; j < 3; ++j) {
    double total = 0;
    for (int i = 0; i < 2; ++i)
      for (int k = 0; k < 4; ++k)
        total += gv[(i * 3 + j) * 4 + k];
    EXPECT_NEAR(reduced.at({j, 0}), total, 1e-14);
  }
  EXPECT_EQ(sum_to(g, {2, 3, 4}).shape(), (dims{2, 3, 4}));
}

TEST(Backend, OpsOnADeviceWithoutBackendSayWhichOpAndDevice) {
  if (cuda_device_count() > 0)
    GTEST_SKIP() << "cuda:0 exists here (its backend: cuda_backend_test.cpp)";
  // Host memory labelled cuda:0 stands in for device memory: the lookup
  // (or, with the CUDA backend built, the allocation of the result) fails
  // before any kernel touches it.
  std::vector<float> host(4, 1.0f);
  auto memory = storage::wrap(host.data(), host.size() * sizeof(float), device::cuda(0), {});
  auto t = tensor::from_storage(memory, {4}, {1}, 0, dtype::float32);
  const bool built = cuda_backend_built();
  EXPECT_THAT(test::usage_error_of([&] { (void)add(t, t); }),
              HasSubstr(built ? "storage::allocate: device cuda:0 is not available"
                              : "add: no backend for device cuda:0 in this build"));
  EXPECT_THAT(test::usage_error_of([&] { (void)matmul(t.view({2, 2}), t.view({2, 2})); }),
              HasSubstr(built ? "device cuda:0 is not available" : "matmul: no backend for device cuda:0"));
  EXPECT_EQ(backend_for(device::cpu()).name(), "cpu");
}

} // namespace
} // namespace troupe
