// The CUDA backend against the CPU (ggml's op-conformance idea): every
// kernel the CUDA backend implements runs on both devices on contiguous,
// strided and broadcast operands, and the results must agree within float
// tolerance. These tests skip, visibly, without a CUDA device.
//
// The tests named *WithoutDevice* / *Table* run everywhere: asking for a
// cuda tensor where there is none is a usage_error that names the device —
// never a crash or a silently wrong result.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string_view>
#include <thread>
#include <vector>

#ifdef TROUPE_CUDA_ON_HOST
#include <cuda_runtime_api.h>
#endif

#include "cuda_device_under_test.hpp"
#include "test_util.hpp"
#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/cuda.hpp"

namespace troupe {
namespace {

using test::expect_close;
using test::sample;
using test::values;
using testing::AnyOf;
using testing::HasSubstr;

const device gpu = test::cuda_device_under_test();

double tolerance(dtype type) {
  return type == dtype::float32 ? 1e-5 : 1e-12;
}

class CudaBackend : public ::testing::Test {
protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
    if (gpu.index >= cuda_device_count())
      GTEST_SKIP() << "the cases are to run on " << gpu.to_string() << ", this machine has " << cuda_device_count()
                   << " CUDA device(s)";
  }
};

TEST_F(CudaBackend, FillZerosOnesFullMatchTheCpu) {
  for (auto type : {dtype::float32, dtype::float64, dtype::int64, dtype::int32, dtype::uint8, dtype::bfloat16}) {
    EXPECT_EQ(values(tensor::zeros({3, 4}, type, gpu)), values(tensor::zeros({3, 4}, type))) << name_of(type);
    EXPECT_EQ(values(tensor::ones({5}, type, gpu)), values(tensor::ones({5}, type))) << name_of(type);
    EXPECT_EQ(values(tensor::full({2, 3}, 7.0, type, gpu)), values(tensor::full({2, 3}, 7.0, type))) << name_of(type);
  }
  // A strided view: only its elements change.
  auto on_gpu = tensor::zeros({4, 6}, dtype::float32, gpu);
  auto on_cpu = tensor::zeros({4, 6});
  on_gpu.slice(1, 1, 6, 2).fill(2.5);
  on_cpu.slice(1, 1, 6, 2).fill(2.5);
  EXPECT_EQ(values(on_gpu), values(on_cpu));
}

TEST_F(CudaBackend, RoundTripThroughTheDeviceIsExactForEveryDtype) {
  for (auto type : {dtype::float32, dtype::float64, dtype::int64, dtype::int32, dtype::uint8, dtype::bfloat16}) {
    auto x = mul(sample({7, 9}, 3), 100.0).to(type);
    auto there = x.to(gpu);
    EXPECT_EQ(there.where(), gpu);
    EXPECT_EQ(there.type(), type);
    auto back = there.to(device::cpu());
    EXPECT_EQ(back.where(), device::cpu());
    ASSERT_EQ(back.nbytes(), x.nbytes());
    EXPECT_EQ(std::memcmp(back.raw_data(), x.raw_data(), x.nbytes()), 0) << name_of(type);
  }
  // A transposed (non-contiguous) source arrives contiguous, same values.
  auto t = sample({5, 3}, 4).t();
  expect_close(t.to(gpu), t, 0.0);
  // Empty tensors travel too.
  EXPECT_EQ(tensor::zeros({0, 3}).to(gpu).to(device::cpu()).shape(), (dims{0, 3}));
}

TEST_F(CudaBackend, DtypeConversionMatchesTheCpu) {
  const auto types = {dtype::float32, dtype::float64, dtype::int64, dtype::int32, dtype::uint8, dtype::bfloat16};
  auto x = add(mul(abs(sample({4, 5}, 5)), 200.0), 0.25); // in [0.25, 200.25): fits every type
  for (auto from : types)
    for (auto to : types) {
      auto source = x.to(from);
      auto expected = source.to(to);
      auto got = source.to(gpu).to(to);
      EXPECT_EQ(got.type(), to);
      EXPECT_EQ(values(got), values(expected)) << name_of(from) << " -> " << name_of(to);
    }
  // Strided and broadcast copies on the device.
  auto y = sample({3, 4}, 6, dtype::float32).to(gpu);
  auto target = tensor::zeros({2, 3, 4}, dtype::float64, gpu);
  target.copy_from(y);
  auto expected = tensor::zeros({2, 3, 4}, dtype::float64);
  expected.copy_from(y.to(device::cpu()));
  expect_close(target, expected, 0.0);
}

TEST_F(CudaBackend, UnaryOpsMatchTheCpu) {
  for (auto type : {dtype::float32, dtype::float64}) {
    auto x = sample({6, 7}, 7, type);
    auto positive = add(abs(x), 0.5);
    auto check = [&](const char* name, auto f, const tensor& in) {
      SCOPED_TRACE(name);
      expect_close(f(in.to(gpu)), f(in), tolerance(type));
      // The same op on a transposed (strided) view.
      expect_close(f(in.t().to(gpu).t()), f(in), tolerance(type));
    };
    check("neg", [](const tensor& a) { return neg(a); }, x);
    check("abs", [](const tensor& a) { return abs(a); }, x);
    check("add_scalar", [](const tensor& a) { return add(a, 1.5); }, x);
    check("mul_scalar", [](const tensor& a) { return mul(a, -3.0); }, x);
    check("pow", [](const tensor& a) { return pow(a, 1.5); }, positive);
    check("exp", [](const tensor& a) { return exp(a); }, x);
    check("log", [](const tensor& a) { return log(a); }, positive);
    check("tanh", [](const tensor& a) { return tanh(a); }, x);
    check("sqrt", [](const tensor& a) { return sqrt(a); }, positive);
    check("relu", [](const tensor& a) { return relu(a); }, x);
    check("gelu", [](const tensor& a) { return gelu(a); }, x);
    check("gelu_tanh", [](const tensor& a) { return gelu(a, gelu_approximation::tanh); }, x);
    check("sigmoid", [](const tensor& a) { return sigmoid(a); }, x);
  }
  for (auto type : {dtype::int64, dtype::int32}) {
    auto x = mul(sample({4, 4}, 8), 50.0).to(type);
    EXPECT_EQ(values(neg(x.to(gpu))), values(neg(x))) << name_of(type);
    EXPECT_EQ(values(abs(x.to(gpu))), values(abs(x))) << name_of(type);
    EXPECT_EQ(values(add(x.to(gpu), 3.0)), values(add(x, 3.0))) << name_of(type);
    EXPECT_EQ(values(mul(x.to(gpu), 2.0)), values(mul(x, 2.0))) << name_of(type);
  }
}

TEST_F(CudaBackend, BinaryOpsMatchTheCpuWithBroadcasting) {
  for (auto type : {dtype::float32, dtype::float64}) {
    auto a = sample({5, 6}, 9, type);
    auto b = sample({5, 6}, 10, type);
    auto row = sample({6}, 11, type);
    auto column = sample({5, 1}, 12, type);
    auto away_from_zero = add(abs(b), 0.5);
    auto check = [&](const char* name, auto f, const tensor& x, const tensor& y) {
      SCOPED_TRACE(name);
      expect_close(f(x.to(gpu), y.to(gpu)), f(x, y), tolerance(type));
    };
    auto all = [&](const char* name, auto f) {
      check(name, f, a, b);
      check(name, f, a, row);    // row-vector broadcast (bias add)
      check(name, f, column, a); // column broadcast on the left
      check(name, f, a.t().contiguous().t(), b); // strided left operand
    };
    all("add", [](const tensor& x, const tensor& y) { return add(x, y); });
    all("sub", [](const tensor& x, const tensor& y) { return sub(x, y); });
    all("mul", [](const tensor& x, const tensor& y) { return mul(x, y); });
    all("maximum", [](const tensor& x, const tensor& y) { return maximum(x, y); });
    all("greater", [](const tensor& x, const tensor& y) { return greater(x, y); });
    all("relu_backward", [](const tensor& x, const tensor& y) { return relu_backward(x, y); });
    all("gelu_backward", [](const tensor& x, const tensor& y) { return gelu_backward(x, y); });
    all("gelu_tanh_backward",
        [](const tensor& x, const tensor& y) { return gelu_backward(x, y, gelu_approximation::tanh); });
    all("sigmoid_backward", [](const tensor& x, const tensor& y) { return sigmoid_backward(x, y); });
    all("tanh_backward", [](const tensor& x, const tensor& y) { return tanh_backward(x, y); });
    check("div", [](const tensor& x, const tensor& y) { return div(x, y); }, a, away_from_zero);
  }
  for (auto type : {dtype::int64, dtype::int32}) {
    auto a = mul(sample({3, 4}, 13), 40.0).to(type);
    auto b = mul(sample({4}, 14), 40.0).to(type);
    EXPECT_EQ(values(add(a.to(gpu), b.to(gpu))), values(add(a, b))) << name_of(type);
    EXPECT_EQ(values(sub(a.to(gpu), b.to(gpu))), values(sub(a, b))) << name_of(type);
    EXPECT_EQ(values(mul(a.to(gpu), b.to(gpu))), values(mul(a, b))) << name_of(type);
  }
}

TEST_F(CudaBackend, InPlaceAxpyScaleAndWhereMatchTheCpu) {
  for (auto type : {dtype::float32, dtype::float64}) {
    auto a = sample({4, 5}, 15, type);
    auto b = sample({5}, 16, type);
    auto on_gpu = a.to(gpu);
    auto on_cpu = a.clone();
    add_(on_gpu, b.to(gpu), 0.5);
    add_(on_cpu, b, 0.5);
    add_(on_gpu, b.to(gpu)); // alpha == 1 takes the plain sum, as on the CPU
    add_(on_cpu, b);
    mul_(on_gpu, -2.0);
    mul_(on_cpu, -2.0);
    expect_close(on_gpu, on_cpu, tolerance(type));
    // In place on a strided view: the other elements stay.
    auto view_gpu = on_gpu.slice(1, 0, 5, 2);
    auto view_cpu = on_cpu.slice(1, 0, 5, 2);
    mul_(view_gpu, 3.0);
    mul_(view_cpu, 3.0);
    expect_close(on_gpu, on_cpu, tolerance(type));

    auto cond = greater(a, tensor::zeros({}, type));
    expect_close(where(cond.to(gpu), a.to(gpu), b.to(gpu)), where(cond, a, b), 0.0);
    auto cond_bytes = cond.to(dtype::uint8);
    expect_close(where(cond_bytes.to(gpu), a.to(gpu), b.to(gpu)), where(cond_bytes, a, b), 0.0);
  }
}

TEST_F(CudaBackend, GemmThroughCublasMatchesTheCpu) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    const double tol = type == dtype::float32 ? 1e-4 : 1e-11;
    auto a = sample({33, 17}, 17, type);
    auto b = sample({17, 9}, 18, type);
    expect_close(matmul(a.to(gpu), b.to(gpu)), matmul(a, b), tol);
    // Transposed operands go to cuBLAS as transposes, not copies.
    auto at = sample({17, 33}, 19, type).t();
    auto bt = sample({9, 17}, 20, type).t();
    auto at_gpu = sample({17, 33}, 19, type).to(gpu).t();
    auto bt_gpu = sample({9, 17}, 20, type).to(gpu).t();
    expect_close(matmul(at_gpu, bt_gpu), matmul(at, bt), tol);
    // A broadcast operand (neither layout) is copied first.
    auto row = sample({1, 9}, 21, type).expand({17, 9});
    expect_close(matmul(a.to(gpu), sample({1, 9}, 21, type).to(gpu).expand({17, 9})), matmul(a, row), tol);
    // addmm_ with beta reads the output; a strided output goes through a temporary.
    auto c = sample({33, 9}, 22, type);
    auto c_gpu = c.to(gpu);
    addmm_(c_gpu, a.to(gpu), b.to(gpu), 0.5, 2.0);
    addmm_(c, a, b, 0.5, 2.0);
    expect_close(c_gpu, c, tol);
    auto wide = tensor::zeros({9, 33}, type);
    auto wide_gpu = tensor::zeros({9, 33}, type, gpu);
    auto out_t = wide.t();
    auto out_t_gpu = wide_gpu.t();
    addmm_(out_t, a, b, 1.0, 0.0);
    addmm_(out_t_gpu, a.to(gpu), b.to(gpu), 1.0, 0.0);
    expect_close(wide_gpu, wide, tol);
    // k == 0: the product is zero, beta still scales.
    auto empty_a = tensor::zeros({4, 0}, type);
    auto empty_b = tensor::zeros({0, 3}, type);
    expect_close(matmul(empty_a.to(gpu), empty_b.to(gpu)), tensor::zeros({4, 3}, type), 0.0);
  }
}

TEST_F(CudaBackend, DeviceToDeviceCopy) {
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "needs two CUDA devices, this machine has " << cuda_device_count();
  auto x = sample({100, 3}, 25, dtype::float32);
  const auto other = device::cuda(gpu.index == 0 ? 1 : 0);
  auto on_second = x.to(gpu).to(other);
  EXPECT_EQ(on_second.where(), other);
  expect_close(on_second, x, 0.0);
}

TEST_F(CudaBackend, BatchedGemmMatchesTheCpuForTransposedAndBroadcastOperands) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    const double tol = type == dtype::float32 ? 1e-4 : 1e-11;
    auto x = sample({3, 5, 4}, 23, type);
    auto y = sample({3, 4, 6}, 24, type);
    expect_close(bmm(x.to(gpu), y.to(gpu)), bmm(x, y), tol);
    // k^T as attention takes it: a transposed view of every matrix.
    auto k = sample({3, 6, 4}, 25, type);
    expect_close(bmm(x.to(gpu), k.to(gpu).transpose(1, 2)), bmm(x, k.transpose(1, 2)), tol);
    // One matrix for the whole batch (batch stride 0).
    auto shared = sample({1, 4, 6}, 26, type);
    expect_close(bmm(x.to(gpu), shared.to(gpu).expand({3, 4, 6})), bmm(x, shared.expand({3, 4, 6})), tol);
  }
}

TEST_F(CudaBackend, ReductionsMatchTheCpuOnContiguousAndStridedRows) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    const double tol = type == dtype::float32 ? 1e-4 : 1e-11;
    // Rows longer than one block (300 > 256 threads) and shorter than a warp.
    for (auto shape : {dims{7, 300}, dims{5, 3}, dims{2, 1000}}) {
      auto x = sample(shape, 30, type);
      expect_close(sum(x.to(gpu), {1}), sum(x, {1}), tol);
      expect_close(sum(x.to(gpu), {0}), sum(x, {0}), tol); // strided rows
      expect_close(mean(x.to(gpu)), mean(x), tol);
      auto m_gpu = max(x.to(gpu), 1);
      auto m_cpu = max(x, 1);
      expect_close(m_gpu.values, m_cpu.values, 0.0);
      EXPECT_EQ(values(m_gpu.indices), values(m_cpu.indices));
      expect_close(argmax(x.to(gpu), 0), argmax(x, 0), 0.0);
    }
    // Ties: the first maximum wins, as on the CPU.
    auto ties = tensor::from<double>({1, 3, 3, 0, 2, 2, 2, 2}, {2, 4}).to(type);
    EXPECT_EQ(values(max(ties.to(gpu), 1).indices), (std::vector<double>{1, 0}));
  }
  auto ints = mul(sample({4, 9}, 31), 30.0).to(dtype::int64);
  EXPECT_EQ(values(sum(ints.to(gpu), {1})), values(sum(ints, {1})));
  EXPECT_EQ(values(max(ints.to(gpu), 1).indices), values(max(ints, 1).indices));
}

TEST_F(CudaBackend, SoftmaxAndItsGradientMatchTheCpu) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    for (auto shape : {dims{6, 10}, dims{3, 700}}) {
      auto x = mul(sample(shape, 32, type), 5.0);
      auto g = sample(shape, 33, type);
      auto y = softmax(x, 1);
      auto ly = log_softmax(x, 1);
      expect_close(softmax(x.to(gpu), 1), y, tolerance(type));
      expect_close(log_softmax(x.to(gpu), 1), ly, 10 * tolerance(type));
      expect_close(softmax_backward(g.to(gpu), y.to(gpu), 1), softmax_backward(g, y, 1), tolerance(type));
      expect_close(log_softmax_backward(g.to(gpu), ly.to(gpu), 1), log_softmax_backward(g, ly, 1),
                   10 * tolerance(type));
      // Over a dimension that is not the last (the op transposes first).
      expect_close(softmax(x.to(gpu), 0), softmax(x, 0), tolerance(type));
    }
  }
}

TEST_F(CudaBackend, CrossEntropyAndItsGradientMatchTheCpu) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    // 300 rows: more than one block's threads sum the rows' losses.
    for (auto shape : {dims{9, 86}, dims{300, 1000}, dims{5, 1}}) {
      SCOPED_TRACE(fmt::format("logits {}", shape));
      auto x = mul(sample(shape, 34, type), 5.0);
      generator gen{35, 0};
      auto targets = randint({shape[0]}, gen, 0, shape[1]);
      auto upstream = tensor::full({}, 0.5, type);
      auto cpu = cross_entropy(x, targets);
      auto cuda = cross_entropy(x.to(gpu), targets.to(gpu));
      expect_close(cuda.loss, cpu.loss, 10 * tolerance(type));
      expect_close(cuda.log_sum_exp, cpu.log_sum_exp, 10 * tolerance(type));
      expect_close(cross_entropy_backward(upstream.to(gpu), x.to(gpu), targets.to(gpu), cuda.log_sum_exp),
                   cross_entropy_backward(upstream, x, targets, cpu.log_sum_exp), tolerance(type));
    }
    // Targets and log Σ exp read through strides (every other element).
    auto x = mul(sample({7, 20}, 36, type), 3.0);
    generator gen{37, 0};
    auto targets = randint({7, 2}, gen, 0, 20).select(1, 1);
    auto lse = cross_entropy(x, targets).log_sum_exp;
    auto strided_lse = stack({lse, lse}, 1).select(1, 0);
    auto upstream = tensor::full({}, -2.0, type);
    expect_close(cross_entropy(x.to(gpu), targets.to(gpu)).loss, cross_entropy(x, targets).loss, 10 * tolerance(type));
    expect_close(cross_entropy_backward(upstream.to(gpu), x.to(gpu), targets.to(gpu), strided_lse.to(gpu)),
                 cross_entropy_backward(upstream, x, targets, lse), tolerance(type));
  }
}

TEST_F(CudaBackend, CausalSoftmaxAndAttentionMatchTheCpu) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    // More keys than queries, fewer, as many; one row longer than a block.
    for (auto shape : {dims{3, 5, 8}, dims{2, 6, 4}, dims{4, 7, 7}, dims{1, 3, 300}}) {
      SCOPED_TRACE(fmt::format("scores {}", shape));
      auto x = mul(sample(shape, 38, type), 4.0);
      auto g = sample(shape, 39, type);
      auto y = causal_softmax(x, 0.35);
      expect_close(causal_softmax(x.to(gpu), 0.35), y, tolerance(type));
      expect_close(causal_softmax_backward(g.to(gpu), y.to(gpu), 0.35), causal_softmax_backward(g, y, 0.35),
                   tolerance(type));
    }
    const std::int64_t batch = 2, seq = 9, heads = 3, width = 12;
    auto qkv = sample({batch, seq, 3 * width}, 40, type);
    auto grad = sample({batch, seq, width}, 41, type);
    generator gen{42, 0};
    for (const auto& mask : {tensor{}, dropout_mask({batch * heads, seq, seq}, 0.2, gen, type)}) {
      SCOPED_TRACE(mask.defined() ? "with a dropout mask" : "without dropout");
      auto cpu = causal_attention(qkv, heads, 0.5, mask);
      auto cuda = causal_attention(qkv.to(gpu), heads, 0.5, mask.defined() ? mask.to(gpu) : mask);
      expect_close(cuda.output, cpu.output, 10 * tolerance(type));
      expect_close(cuda.weights, cpu.weights, tolerance(type));
      expect_close(causal_attention_backward(grad.to(gpu), qkv.to(gpu), cuda.weights, heads, 0.5,
                                             mask.defined() ? mask.to(gpu) : mask),
                   causal_attention_backward(grad, qkv, cpu.weights, heads, 0.5, mask), 10 * tolerance(type));
    }
  }
}

TEST_F(CudaBackend, IndexingMatchesTheCpuWithRepeatedIndices) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    auto a = sample({5, 4, 3}, 34, type);
    auto index = tensor::from<std::int64_t>({4, 0, 0, 2, 4, 4}, {6});
    for (std::int64_t dim : {0, 2}) {
      auto i = dim == 0 ? index : tensor::from<std::int64_t>({2, 0, 2, 1}, {4});
      expect_close(index_select(a.to(gpu), dim, i.to(gpu)), index_select(a, dim, i), 0.0);
      auto target = sample(dim == 0 ? dims{5, 4, 3} : dims{5, 4, 3}, 35, type);
      auto src = sample(dim == 0 ? dims{6, 4, 3} : dims{5, 4, 4}, 36, type);
      auto on_gpu = target.to(gpu);
      index_add_(on_gpu, dim, i.to(gpu), src.to(gpu));
      index_add_(target, dim, i, src);
      expect_close(on_gpu, target, tolerance(type));
    }
    // index_select from a strided view.
    expect_close(index_select(a.to(gpu).transpose(0, 1), 1, index.to(gpu)), index_select(a.transpose(0, 1), 1, index),
                 0.0);
    auto gather_index = tensor::from<std::int64_t>({0, 2, 1, 1, 0, 0, 2, 2}, {4, 2});
    auto m = sample({4, 3}, 37, type);
    expect_close(gather(m.to(gpu), 1, gather_index.to(gpu)), gather(m, 1, gather_index), 0.0);
    auto scatter_index = tensor::from<std::int64_t>({0, 0, 3, 3, 3, 1}, {3, 2});
    auto src = sample({3, 2}, 38, type);
    auto base = sample({4, 2}, 39, type);
    expect_close(scatter_add(base.to(gpu), 0, scatter_index.to(gpu), src.to(gpu)),
                 scatter_add(base, 0, scatter_index, src), tolerance(type));
  }
}

TEST_F(CudaBackend, EmbeddingBagsMatchTheCpu) {
  auto weight = sample({6, 5}, 40, dtype::float32);
  auto indices = tensor::from<std::int64_t>({1, 5, 5, 0, 2, 1, 1}, {7});
  auto offsets = tensor::from<std::int64_t>({0, 2, 2, 5}, {4}); // an empty bag at 2
  for (auto mode : {bag_mode::sum, bag_mode::mean}) {
    expect_close(embedding_bag(weight.to(gpu), indices.to(gpu), offsets.to(gpu), mode),
                 embedding_bag(weight, indices, offsets, mode), 1e-6);
    auto grad = sample({4, 5}, 41, dtype::float32);
    expect_close(embedding_bag_backward(grad.to(gpu), indices.to(gpu), offsets.to(gpu), mode, 6),
                 embedding_bag_backward(grad, indices, offsets, mode, 6), 1e-6);
  }
}

// Shapes among which cuDNN picks different algorithms: channels 16 -> 32
// at 14 x 14, a 1 x 1 convolution, a non-square kernel with stride and
// padding, a 5 x 5 kernel over a batch of 5, 64 -> 64 channels at 7 x 7, and
// input that is a non-contiguous view. gpu_check.sh runs this once as the
// machine has it (cuDNN where loaded) and once with TROUPE_CUDNN=off
// (troupe's im2col kernels). On the stand-in CUDA, its cuDNN runs every
// pass, or none with TROUPE_CUDNN=off.
TEST_F(CudaBackend, ConvolutionsOfManyShapesMatchTheCpu) {
  std::printf("conv2d on CUDA: %s\n", cuda_convolution().c_str());
#ifdef TROUPE_CUDA_ON_HOST
  const auto passes_before = cuda_on_host::library_passes();
#endif
  struct conv_case {
    dims input, weight;
    conv2d_options options;
  };
  const conv_case cases[] = {
    {{4, 16, 14, 14}, {32, 16, 3, 3}, {1, 1}}, {{3, 8, 10, 10}, {12, 8, 1, 1}, {1, 0}},
    {{2, 5, 11, 9}, {7, 5, 2, 3}, {2, 1}},     {{5, 3, 16, 16}, {6, 3, 5, 5}, {1, 2}},
    {{1, 64, 7, 7}, {64, 64, 3, 3}, {1, 1}},
  };
  for (auto type : {dtype::float32, dtype::float64}) {
    const double tol = type == dtype::float32 ? 1e-4 : 1e-11;
    for (std::size_t i = 0; i < std::size(cases); ++i) {
      const auto& c = cases[i];
      SCOPED_TRACE(fmt::format("{} case {}: input {} weight {}", type, i, c.input, c.weight));
      auto input = sample(c.input, 50 + i, type);
      if (i == 2) // [n, h, c, w] read as [n, c, h, w]: not contiguous
        input = sample({c.input[0], c.input[2], c.input[1], c.input[3]}, 50 + i, type).transpose(1, 2);
      auto weight = sample(c.weight, 60 + i, type);
      auto bias = sample({c.weight[0]}, 70 + i, type);
      auto out = conv2d(input, weight, bias, c.options);
      expect_close(conv2d(input.to(gpu), weight.to(gpu), bias.to(gpu), c.options), out, tol);
      auto grad = sample(out.shape(), 80 + i, type);
      auto want = conv2d_backward(grad, input, weight, true, c.options);
      auto got = conv2d_backward(grad.to(gpu), input.to(gpu), weight.to(gpu), true, c.options);
      expect_close(got.input, want.input, tol);
      expect_close(got.weight, want.weight, tol);
      expect_close(got.bias, want.bias, tol);
      auto weight_only = conv2d_backward(grad.to(gpu), input.to(gpu), weight.to(gpu), false, c.options, false);
      EXPECT_FALSE(weight_only.input.defined());
      expect_close(weight_only.weight, want.weight, tol);
    }
  }
#ifdef TROUPE_CUDA_ON_HOST
  // Per case and dtype: the forward, both gradients, the weight's alone.
  const char* choice = std::getenv("TROUPE_CUDNN");
  const bool cudnn_off = choice != nullptr && (std::string_view(choice) == "off" || std::string_view(choice) == "0");
  EXPECT_EQ(cuda_on_host::library_passes() - passes_before, cudnn_off ? 0u : 2 * std::size(cases) * 4)
    << "passes the stand-in cuDNN ran";
#endif
}

// Distributed training is checked against one process bit for bit, so a
// convolution's gradients must not depend on the run: cuDNN's algorithms
// that sum with atomics (in a new order each time) are not taken.
TEST_F(CudaBackend, ConvolutionGradientsAreTheSameBitsEveryTime) {
  auto input = sample({6, 8, 9, 9}, 90, dtype::float32).to(gpu);
  auto weight = sample({12, 8, 3, 3}, 91, dtype::float32).to(gpu);
  const conv2d_options options{1, 1};
  auto grad = sample({6, 12, 9, 9}, 92, dtype::float32).to(gpu);
  const auto first = conv2d_backward(grad, input, weight, true, options);
  for (int run = 0; run < 3; ++run) {
    const auto again = conv2d_backward(grad, input, weight, true, options);
    EXPECT_EQ(values(again.input), values(first.input)) << "run " << run;
    EXPECT_EQ(values(again.weight), values(first.weight)) << "run " << run;
  }
}

TEST_F(CudaBackend, ConvolutionAndPoolingMatchTheCpu) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    const double tol = type == dtype::float32 ? 1e-4 : 1e-11;
    auto input = sample({2, 3, 7, 6}, 42, type);
    auto weight = sample({4, 3, 3, 3}, 43, type);
    auto bias = sample({4}, 44, type);
    for (auto options : {conv2d_options{1, 0}, conv2d_options{2, 1}}) {
      auto out = conv2d(input, weight, bias, options);
      expect_close(conv2d(input.to(gpu), weight.to(gpu), bias.to(gpu), options), out, tol);
      auto grad = sample(out.shape(), 45, type);
      auto want = conv2d_backward(grad, input, weight, true, options);
      auto got = conv2d_backward(grad.to(gpu), input.to(gpu), weight.to(gpu), true, options);
      expect_close(got.input, want.input, tol);
      expect_close(got.weight, want.weight, tol);
      expect_close(got.bias, want.bias, tol);
    }
    // Overlapping windows (stride < kernel): gradients of one input add up.
    for (auto options : {pool2d_options{2, 2}, pool2d_options{3, 1}}) {
      auto pooled = max_pool2d(input, options);
      auto on_gpu = max_pool2d(input.to(gpu), options);
      expect_close(on_gpu.output, pooled.output, 0.0);
      EXPECT_EQ(values(on_gpu.indices), values(pooled.indices));
      auto grad = sample(pooled.output.shape(), 46, type);
      expect_close(max_pool2d_backward(grad.to(gpu), on_gpu.indices, input.shape()),
                   max_pool2d_backward(grad, pooled.indices, input.shape()), tol);
    }
  }
}

TEST_F(CudaBackend, LayerNormAndItsGradientsMatchTheCpu) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    // The last shape has more rows (210) than one chunk of the parameter
    // gradients' first pass.
    const double tol = type == dtype::float32 ? 1e-4 : 1e-10;
    for (auto shape : {dims{4, 3, 16}, dims{5, 300}, dims{3, 70, 33}}) {
      auto x = add(mul(sample(shape, 47, type), 3.0), 2.0);
      const auto d = shape.back();
      auto w = sample({d}, 48, type);
      auto b = sample({d}, 49, type);
      auto want = layer_norm(x, w, b);
      auto got = layer_norm(x.to(gpu), w.to(gpu), b.to(gpu));
      expect_close(got.output, want.output, tol);
      expect_close(got.mean, want.mean, tol);
      expect_close(got.rstd, want.rstd, tol);
      auto g = sample(shape, 50, type);
      auto grads_want = layer_norm_backward(g, x, want, w);
      auto grads_got = layer_norm_backward(g.to(gpu), x.to(gpu), got, w.to(gpu));
      expect_close(grads_got.input, grads_want.input, tol);
      expect_close(grads_got.weight, grads_want.weight, tol);
      expect_close(grads_got.bias, grads_want.bias, tol);
      // Without an affine transform.
      expect_close(layer_norm(x.to(gpu), {}, {}).output, layer_norm(x, {}, {}).output, tol);
    }
  }
}

TEST_F(CudaBackend, RandomDrawsAreTheCpusNumbers) {
  for (auto type : {dtype::float32, dtype::float64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    generator on_cpu{77, 5};
    generator on_gpu{77, 5};
    expect_close(rand({1000}, on_gpu, -2.0, 3.0, type, gpu), rand({1000}, on_cpu, -2.0, 3.0, type), 0.0);
    expect_close(randn({1000}, on_gpu, 1.0, 2.0, type, gpu), randn({1000}, on_cpu, 1.0, 2.0, type),
                 type == dtype::float32 ? 1e-6 : 1e-12);
    expect_close(dropout_mask({999}, 0.3, on_gpu, type, gpu), dropout_mask({999}, 0.3, on_cpu, type), 0.0);
    EXPECT_EQ(on_gpu.offset, on_cpu.offset);
  }
  generator on_cpu{9};
  generator on_gpu{9};
  EXPECT_EQ(values(randint({500}, on_gpu, -7, 1000, gpu)), values(randint({500}, on_cpu, -7, 1000)));
}

TEST_F(CudaBackend, MixingDevicesIsAUsageError) {
  auto a = sample({2, 2}, 27, dtype::float32);
  EXPECT_THROW(add(a, a.to(gpu)), usage_error);
  EXPECT_THROW(matmul(a.to(gpu), a), usage_error);
  auto target = tensor::zeros({2, 2}, dtype::float32, gpu);
  try {
    target.copy_from(a);
    ADD_FAILURE() << "copy_from across devices did not throw";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("to(device)"));
  }
}

// -- threads ---------------------------------------------------------------------------
//
// Each thread queues its work on a stream of its own; a tensor handed to
// another thread carries its last user's stream, which the next user waits
// for, and is freed on it. A long GEMM chain keeps one stream busy for
// milliseconds, so a missing wait reads unfinished or reused memory.

constexpr std::int64_t busy_width = 2048;
constexpr int busy_rounds = 30;

/// `x` times the averaging matrix, `rounds` times: every row becomes its
/// mean (the averaging matrix is idempotent), after milliseconds of GEMMs.
tensor averaged_slowly(const tensor& x, const tensor& averaging) {
  auto y = x;
  for (int i = 0; i < busy_rounds; ++i)
    y = matmul(y, averaging);
  return y;
}

struct busy_operands {
  tensor x_cpu = sample({busy_width, busy_width}, 5, dtype::float32);
  tensor averaging_cpu = tensor::full({busy_width, busy_width}, 1.0 / busy_width, dtype::float32);
  tensor x = x_cpu.to(gpu);
  tensor averaging = averaging_cpu.to(gpu);
  /// What `mul(averaged_slowly(x), 2)` must give.
  tensor doubled_row_means() const { return mul(matmul(x_cpu, averaging_cpu), 2.0); }
};

TEST_F(CudaBackend, ATensorHandedToAnotherThreadCarriesItsWrites) {
  busy_operands in;
  std::promise<tensor> handed;
  auto arriving = handed.get_future();
  std::promise<void> consumer_has_a_stream;
  tensor doubled;
  std::thread consumer([&] {
    // The consumer takes its stream before the producer starts: streams are
    // pooled, and one taken after the producer's thread ended could be the
    // producer's own, which needs no wait.
    tensor::zeros({1}, dtype::float32, gpu);
    consumer_has_a_stream.set_value();
    doubled = mul(arriving.get(), 2.0).to(device::cpu());
  });
  std::thread producer([&] {
    consumer_has_a_stream.get_future().wait();
    // Handed on while its GEMMs are still queued: no synchronisation here.
    handed.set_value(averaged_slowly(in.x, in.averaging));
  });
  producer.join();
  consumer.join();
  expect_close(doubled, in.doubled_row_means(), 1e-4);
}

TEST_F(CudaBackend, MemoryFreedByOneThreadOutlivesAnotherThreadsRead) {
  busy_operands in;
  auto owned = matmul(in.x, in.averaging);
  std::promise<tensor> handed;
  std::promise<void> read_queued;
  std::promise<void> owner_let_go;
  tensor doubled;
  std::thread reader([&, arriving = handed.get_future(), let_go = owner_let_go.get_future()]() mutable {
    auto y = arriving.get();
    auto busy = averaged_slowly(in.x, in.averaging); // the reader's stream is busy...
    auto z = mul(y, 2.0);                             // ...so this read of y is queued behind it
    y = tensor();
    read_queued.set_value();
    let_go.wait(); // the read is still queued when the owner drops the block
    doubled = z.to(device::cpu());
  });
  handed.set_value(owned);
  read_queued.get_future().wait();
  // The last reference goes here, while the reader's read may still be
  // queued: the block must not return to the pool before it runs. Blocks of
  // the same size, written at once, would take it.
  owned = tensor();
  std::vector<tensor> scribbles;
  for (int i = 0; i < 4; ++i)
    scribbles.push_back(tensor::full({busy_width, busy_width}, -7.0, dtype::float32, gpu));
  // And this thread's stream runs all it queued, a free on it included.
  cuda_synchronize(gpu);
  owner_let_go.set_value();
  reader.join();
  expect_close(doubled, in.doubled_row_means(), 1e-4);
}

TEST_F(CudaBackend, CopiesToTheDeviceKeepTheBytesOfTheMomentTheyWereMade) {
  // Small copies return before their DMA has run (staged through pinned
  // slots); the host tensor is rewritten at once, and more copies than
  // slots are made while the stream is still busy.
  busy_operands in;
  auto busy = averaged_slowly(in.x, in.averaging);
  auto host = tensor::zeros({64, 64}, dtype::float32);
  std::vector<tensor> copies;
  for (int i = 0; i < 10; ++i) {
    host.fill(i);
    copies.push_back(host.to(gpu));
  }
  host.fill(-1.0);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(values(copies[static_cast<std::size_t>(i)]), values(tensor::full({64, 64}, i, dtype::float32)))
      << "copy " << i;
  expect_close(mul(busy, 2.0).to(device::cpu()), in.doubled_row_means(), 1e-4);
}

TEST_F(CudaBackend, LargeCopiesToTheDeviceKeepTheBytesOfTheMomentTheyWereMade) {
  // A copy larger than all pinned slots together goes through them in turn
  // and returns once its last piece is staged: the host tensor is then
  // rewritten while pieces may still be on their way.
  busy_operands in;
  auto busy = averaged_slowly(in.x, in.averaging);
  const std::int64_t count = 9 * (std::int64_t{1} << 20) + 3; // 36 MiB and 12 bytes of float32
  auto host = tensor::empty({count}, dtype::float32);
  auto* data = static_cast<float*>(host.raw_data());
  for (std::int64_t i = 0; i < count; ++i)
    data[i] = static_cast<float>(i % 1000003);
  auto expected = host.clone();
  auto first = host.to(gpu);
  host.fill(-1.0);
  auto second = host.to(gpu);
  host.fill(-2.0);
  auto first_back = first.to(device::cpu());
  auto second_back = second.to(device::cpu());
  auto minus_one = tensor::full({count}, -1.0, dtype::float32);
  EXPECT_EQ(std::memcmp(first_back.raw_data(), expected.raw_data(), expected.nbytes()), 0);
  EXPECT_EQ(std::memcmp(second_back.raw_data(), minus_one.raw_data(), minus_one.nbytes()), 0);
  expect_close(mul(busy, 2.0).to(device::cpu()), in.doubled_row_means(), 1e-4);
}

// -- without a device ------------------------------------------------------------------

TEST(CudaWithoutDevice, CountIsZeroWithAReasonAndNothingCrashes) {
  if (cuda_device_count() > 0)
    GTEST_SKIP() << "this machine has " << cuda_device_count() << " CUDA device(s)";
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_FALSE(cuda_unavailable_reason().empty());
  EXPECT_THROW(cuda_synchronize(gpu), usage_error);
}

TEST(CudaWithoutDevice, CudaTensorsAreAClearUsageError) {
  if (cuda_device_count() > 0)
    GTEST_SKIP() << "this machine has " << cuda_device_count() << " CUDA device(s)";
  // Without the backend: "no backend for device cuda:0 in this build";
  // with it but no device: "device cuda:0 is not available: <runtime's reason>".
  auto names_the_device = AllOf(HasSubstr("cuda:0"), AnyOf(HasSubstr("in this build"), HasSubstr("not available")));
  try {
    tensor::zeros({2, 3}, dtype::float32, gpu);
    ADD_FAILURE() << "a cuda tensor without a device";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), names_the_device);
  }
  try {
    sample({2, 3}).to(gpu);
    ADD_FAILURE() << "to(cuda:0) without a device";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), names_the_device);
  }
}

TEST(CudaWithoutDevice, AnOrdinalBeyondTheDevicesIsAUsageError) {
  try {
    tensor::empty({1}, dtype::float32, device::cuda(99));
    ADD_FAILURE() << "cuda:99 exists?";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cuda:99"));
  }
}

TEST(CudaBackendTable, ACudaBuildRegistersTheCudaBackend) {
  if (!cuda_backend_built()) {
    EXPECT_THAT([&] { backend_for(gpu, "softmax"); },
                testing::ThrowsMessage<usage_error>(HasSubstr("no backend for device cuda:0 in this build")));
    return;
  }
  EXPECT_EQ(backend_for(gpu, "test").name(), "cuda");
}

} // namespace
} // namespace troupe
