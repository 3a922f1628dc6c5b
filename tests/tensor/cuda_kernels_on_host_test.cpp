// The CUDA backend's kernels, compiled for the host and run there
// (tests/support/cuda_on_host/cuda_on_host.hpp), against the CPU backend:
// their indexing, masks, reductions and launch geometry, on every machine.
// The kernels on a GPU are tensor.cuda_backend_test's (it skips without
// one); this checks what a GPU is not needed for.
#include <array>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

#include "cuda/cuda_kernels.hpp"

namespace troupe {
namespace {

namespace kernels = troupe::detail::cuda;

using test::expect_close;
using test::sample;

kernels::element element_of(dtype type) {
  return static_cast<kernels::element>(static_cast<std::uint8_t>(type));
}

double tolerance(dtype type) {
  return type == dtype::float32 ? 1e-5 : 1e-12;
}

const std::vector<dtype> floating{dtype::float32, dtype::float64};

TEST(CudaKernelsOnHost, SoftmaxAndItsGradientAreTheCpus) {
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    for (auto shape : {dims{6, 10}, dims{3, 300}}) {
      auto x = mul(sample(shape, 32, type), 5.0);
      auto g = sample(shape, 33, type);
      for (bool log : {false, true}) {
        SCOPED_TRACE(log ? "log_softmax" : "softmax");
        auto y = log ? log_softmax(x, 1) : softmax(x, 1);
        auto out = tensor::empty(shape, type);
        kernels::launch_softmax(element_of(type), x.raw_data(), shape[0], shape[1], log, out.raw_data(), nullptr);
        expect_close(out, y, tolerance(type));
        auto dx = tensor::empty(shape, type);
        kernels::launch_softmax_backward(element_of(type), g.raw_data(), y.raw_data(), shape[0], shape[1], log,
                                         dx.raw_data(), nullptr);
        expect_close(dx, log ? log_softmax_backward(g, y, 1) : softmax_backward(g, y, 1), tolerance(type));
      }
    }
  }
}

TEST(CudaKernelsOnHost, CausalSoftmaxAndItsGradientAreTheCpus) {
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    // More keys than queries, fewer, as many; a row longer than a block.
    for (auto shape : {dims{3, 5, 8}, dims{2, 6, 4}, dims{4, 7, 7}, dims{1, 3, 300}}) {
      SCOPED_TRACE(fmt::format("scores {}", shape));
      auto x = mul(sample(shape, 38, type), 4.0);
      auto g = sample(shape, 39, type);
      const auto rows = shape[0] * shape[1], queries = shape[1], cols = shape[2];
      auto y = causal_softmax(x, 0.35);
      auto out = tensor::full(shape, 7.0, type); // what the mask covers must be written 0
      kernels::launch_causal_softmax(element_of(type), x.raw_data(), rows, queries, cols, 0.35, out.raw_data(),
                                     nullptr);
      expect_close(out, y, tolerance(type));
      auto dx = tensor::full(shape, 7.0, type);
      kernels::launch_causal_softmax_backward(element_of(type), g.raw_data(), y.raw_data(), rows, queries, cols, 0.35,
                                              dx.raw_data(), nullptr);
      auto want = causal_softmax_backward(g, y, 0.35);
      expect_close(dx, want, tolerance(type));
      // In place, as the attention's backward may call it.
      auto in_place = g.clone();
      kernels::launch_causal_softmax_backward(element_of(type), in_place.raw_data(), y.raw_data(), rows, queries,
                                              cols, 0.35, in_place.raw_data(), nullptr);
      expect_close(in_place, want, tolerance(type));
    }
  }
}

TEST(CudaKernelsOnHost, CrossEntropyAndItsGradientAreTheCpus) {
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    // 70 rows: the mean is summed by more threads than one warp.
    for (auto shape : {dims{9, 86}, dims{70, 300}, dims{5, 1}}) {
      SCOPED_TRACE(fmt::format("logits {}", shape));
      const auto rows = shape[0], cols = shape[1];
      auto x = mul(sample(shape, 34, type), 5.0);
      generator gen{35, 0};
      // Targets and log Σ exp read through a stride of 2.
      auto targets = randint({rows, 2}, gen, 0, cols).select(1, 1);
      auto cpu = cross_entropy(x, targets);
      auto loss = tensor::empty({}, type);
      auto lse = tensor::empty({rows}, type);
      kernels::launch_cross_entropy(element_of(type), x.raw_data(), targets.data<std::int64_t>(), 2, rows, cols,
                                    loss.raw_data(), lse.raw_data(), nullptr);
      expect_close(loss, cpu.loss, 10 * tolerance(type));
      expect_close(lse, cpu.log_sum_exp, 10 * tolerance(type));
      auto strided_lse = stack({cpu.log_sum_exp, cpu.log_sum_exp}, 1).select(1, 0);
      auto upstream = tensor::full({}, -2.0, type);
      auto dx = tensor::empty(shape, type);
      kernels::launch_cross_entropy_backward(element_of(type), upstream.raw_data(), x.raw_data(),
                                             targets.data<std::int64_t>(), 2, strided_lse.raw_data(), 2, rows, cols,
                                             dx.raw_data(), nullptr);
      expect_close(dx, cross_entropy_backward(upstream, x, targets, cpu.log_sum_exp), tolerance(type));
    }
  }
}

TEST(CudaKernelsOnHost, LayerNormAndItsGradientsAreTheCpus) {
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    // 300 rows: the parameters' gradients are summed in more than one chunk.
    for (auto shape : {dims{5, 12}, dims{300, 40}}) {
      const auto rows = shape[0], d = shape[1];
      auto x = sample(shape, 40, type);
      auto weight = sample({d}, 41, type);
      auto bias = sample({d}, 42, type);
      auto g = sample(shape, 43, type);
      for (bool affine : {true, false}) {
        SCOPED_TRACE(fmt::format("rows {} d {} {}", rows, d, affine ? "with weight and bias" : "plain"));
        const auto w = affine ? weight : tensor{};
        const auto b = affine ? bias : tensor{};
        auto cpu = layer_norm(x, w, b);
        auto out = tensor::empty(shape, type), mean = tensor::empty({rows}, type), rstd = tensor::empty({rows}, type);
        kernels::launch_layer_norm(element_of(type), x.raw_data(), affine ? w.raw_data() : nullptr,
                                   affine ? b.raw_data() : nullptr, rows, d, 1e-5, out.raw_data(), mean.raw_data(),
                                   rstd.raw_data(), nullptr);
        expect_close(out, cpu.output, 10 * tolerance(type));
        expect_close(mean, cpu.mean.reshape({rows}), tolerance(type));
        expect_close(rstd, cpu.rstd.reshape({rows}), 10 * tolerance(type));
        auto grads = layer_norm_backward(g, x, cpu, w);
        auto dx = tensor::empty(shape, type), dw = tensor::empty({d}, type), db = tensor::empty({d}, type);
        kernels::launch_layer_norm_backward(element_of(type), g.raw_data(), x.raw_data(), cpu.mean.raw_data(),
                                            cpu.rstd.raw_data(), affine ? w.raw_data() : nullptr, rows, d,
                                            dx.raw_data(), dw.raw_data(), db.raw_data(), nullptr);
        expect_close(dx, grads.input, 10 * tolerance(type));
        if (affine) {
          expect_close(dw, grads.weight, 100 * tolerance(type));
          expect_close(db, grads.bias, 100 * tolerance(type));
        }
      }
    }
  }
}

TEST(CudaKernelsOnHost, RowSumsAndMaximaAreTheCpus) {
  for (auto type : {dtype::float32, dtype::float64, dtype::int64}) {
    SCOPED_TRACE(fmt::format("{}", type));
    auto a = mul(sample({7, 300}, 44, dtype::float64), 50.0).to(type);
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(transposed ? "columns" : "rows");
      auto view = transposed ? a.t() : a;
      const auto rows = view.size(0), cols = view.size(1);
      auto sums = tensor::empty({rows}, type), maxima = tensor::empty({rows}, type);
      auto at = tensor::empty({rows}, dtype::int64);
      kernels::launch_reduce_rows(false, element_of(type), view.raw_data(), rows, cols, view.strides()[0],
                                  view.strides()[1], sums.raw_data(), nullptr, nullptr);
      kernels::launch_reduce_rows(true, element_of(type), view.raw_data(), rows, cols, view.strides()[0],
                                  view.strides()[1], maxima.raw_data(), at.data<std::int64_t>(), nullptr);
      expect_close(sums, sum(view, {1}), 1e-3);
      auto cpu = max(view, 1);
      expect_close(maxima, cpu.values, 0.0);
      EXPECT_EQ(test::values(at), test::values(cpu.indices));
    }
  }
}

TEST(CudaKernelsOnHost, RandomDrawsAreTheCpus) {
  auto& cpu = backend_for(device::cpu());
  const generator gen{77, 1234};
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    for (auto [what, a, b] : {std::tuple{random_distribution::uniform, -2.0, 3.0},
                              std::tuple{random_distribution::normal, 0.5, 2.0},
                              std::tuple{random_distribution::dropout, 0.3, 1.0 / 0.7}}) {
      SCOPED_TRACE(static_cast<int>(what));
      auto want = tensor::empty({1000}, type);
      cpu.fill_random(what, gen, a, b, want);
      auto got = tensor::empty({1000}, type);
      kernels::launch_fill_random(static_cast<kernels::distribution>(what), element_of(type), gen.seed, gen.offset,
                                  a, b, got.raw_data(), 1000, nullptr);
      expect_close(got, want, what == random_distribution::normal ? tolerance(type) : 0.0);
    }
  }
  auto want = tensor::empty({1000}, dtype::int64);
  cpu.fill_random(random_distribution::integer, gen, -5, 9, want);
  auto got = tensor::empty({1000}, dtype::int64);
  kernels::launch_fill_random(kernels::distribution::integer, kernels::element::int64, gen.seed, gen.offset, -5, 9,
                              got.raw_data(), 1000, nullptr);
  EXPECT_EQ(test::values(got), test::values(want));
}

TEST(CudaKernelsOnHost, OptimizerStepsAreTheCpus) {
  auto& cpu = backend_for(device::cpu());
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    const auto grad = sample({600}, 50, type);
    const adam_step_args adam{.beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .step_size = 0.01,
                              .bias_correction2_sqrt = 0.3, .l2 = 0.02, .decay = 0.999};
    auto p = sample({600}, 51, type), m = sample({600}, 52, type), v = mul(sample({600}, 53, type), 0.0);
    auto p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
    cpu.adam_step(p, grad, m, v, adam);
    kernels::launch_adam_step(element_of(type), p2.raw_data(), grad.raw_data(), m2.raw_data(), v2.raw_data(), 600,
                              {adam.beta1, adam.beta2, adam.eps, adam.step_size, adam.bias_correction2_sqrt, adam.l2,
                               adam.decay},
                              nullptr);
    expect_close(p2, p, tolerance(type));
    expect_close(m2, m, tolerance(type));
    expect_close(v2, v, tolerance(type));
    for (bool nesterov : {false, true}) {
      const sgd_step_args sgd{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01,
                              .nesterov = nesterov, .first = false};
      auto q = sample({600}, 54, type), buffer = sample({600}, 55, type);
      auto q2 = q.clone(), buffer2 = buffer.clone();
      cpu.sgd_step(q, grad, buffer, sgd);
      kernels::launch_sgd_step(element_of(type), q2.raw_data(), grad.raw_data(), buffer2.raw_data(), 600,
                               {sgd.lr, sgd.momentum, sgd.dampening, sgd.weight_decay, sgd.nesterov, sgd.first},
                               nullptr);
      expect_close(q2, q, tolerance(type));
      expect_close(buffer2, buffer, tolerance(type));
    }
  }
}

TEST(CudaKernelsOnHost, ImageColumnsAndPoolingAreTheCpus) {
  auto& cpu = backend_for(device::cpu());
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    // A rectangular kernel with stride and padding, over a transposed
    // (strided) image.
    auto image = sample({3, 9, 8}, 60, type).transpose(1, 2);
    conv_geometry g{.channels = 3, .height = 8, .width = 9, .kernel_h = 3, .kernel_w = 2, .stride = 2, .padding = 1};
    g.out_h = (g.height + 2 * g.padding - g.kernel_h) / g.stride + 1;
    g.out_w = (g.width + 2 * g.padding - g.kernel_w) / g.stride + 1;
    const kernels::conv_shape shape{g.channels, g.height, g.width, g.kernel_h, g.kernel_w,
                                    g.stride,   g.padding, g.out_h, g.out_w};
    const dims cols_shape{g.channels * g.kernel_h * g.kernel_w, g.out_h * g.out_w};
    auto want = tensor::empty(cols_shape, type);
    cpu.im2col(image, g, want);
    auto got = tensor::full(cols_shape, 7.0, type);
    kernels::launch_im2col(element_of(type), image.raw_data(), image.strides().data(), shape, got.raw_data(),
                           nullptr);
    expect_close(got, want, 0.0);
    const auto cols = sample(cols_shape, 61, type);
    auto summed = sample({3, 8, 9}, 62, type);
    auto summed_here = summed.clone();
    cpu.col2im(cols, g, summed);
    kernels::launch_col2im(element_of(type), cols.raw_data(), shape, summed_here.raw_data(), nullptr);
    expect_close(summed_here, summed, tolerance(type));

    // Pooling with windows that overlap (kernel 3, stride 2) and ties.
    auto input = mul(sample({2, 3, 9, 7}, 63, type), 4.0).to(dtype::int64).to(type);
    auto pooled = max_pool2d(input, pool2d_options{3, 2});
    const auto oh = pooled.output.size(2), ow = pooled.output.size(3);
    auto output = tensor::empty(pooled.output.shape(), type);
    auto indices = tensor::empty(pooled.output.shape(), dtype::int64);
    kernels::launch_max_pool2d(element_of(type), input.raw_data(), 6, 9, 7, 3, 2, oh, ow, output.raw_data(),
                               indices.data<std::int64_t>(), nullptr);
    expect_close(output, pooled.output, 0.0);
    EXPECT_EQ(test::values(indices), test::values(pooled.indices));
    auto grad = sample(pooled.output.shape(), 64, type);
    auto grad_input = tensor::zeros(input.shape(), type);
    kernels::launch_max_pool2d_backward(element_of(type), grad.raw_data(), pooled.indices.data<std::int64_t>(), 6,
                                        oh * ow, 9 * 7, grad_input.raw_data(), nullptr);
    expect_close(grad_input, max_pool2d_backward(grad, pooled.indices, input.shape()), tolerance(type));
  }
}

TEST(CudaKernelsOnHost, EmbeddingBagsAreTheCpus) {
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    auto weight = sample({10, 6}, 65, type);
    // Repeated ids, an empty bag, and a last bag running to the end.
    auto indices = tensor::from<std::int64_t>({3, 3, 9, 0, 4, 4, 4, 7}, {8});
    auto offsets = tensor::from<std::int64_t>({0, 2, 2, 5}, {4});
    for (auto mode : {bag_mode::sum, bag_mode::mean}) {
      SCOPED_TRACE(mode == bag_mode::sum ? "sum" : "mean");
      const bool mean = mode == bag_mode::mean;
      auto out = tensor::full({4, 6}, 7.0, type);
      kernels::launch_embedding_bag(element_of(type), weight.raw_data(), indices.data<std::int64_t>(), 8,
                                    offsets.data<std::int64_t>(), 4, 6, mean, out.raw_data(), nullptr);
      expect_close(out, embedding_bag(weight, indices, offsets, mode), tolerance(type));
      auto grad = sample({4, 6}, 66, type);
      auto grad_weight = tensor::zeros({10, 6}, type);
      kernels::launch_embedding_bag_backward(element_of(type), grad.raw_data(), indices.data<std::int64_t>(), 8,
                                             offsets.data<std::int64_t>(), 4, 6, mean, grad_weight.raw_data(),
                                             nullptr);
      expect_close(grad_weight, embedding_bag_backward(grad, indices, offsets, mode, 10), tolerance(type));
    }
  }
}

/// The index space of a contiguous tensor and the operand of any view, as
/// the CUDA backend describes them (cuda_backend.cpp's space_of and
/// operand_of).
kernels::index_space space_of(const tensor& t) {
  kernels::index_space space;
  space.rank = static_cast<int>(t.rank());
  for (int d = 0; d < space.rank; ++d)
    space.sizes[d] = t.size(d);
  space.numel = t.numel();
  space.contiguous = true;
  return space;
}

kernels::operand operand_of(const tensor& t) {
  kernels::operand o;
  o.data = t.raw_data();
  o.type = element_of(t.type());
  for (std::size_t d = 0; d < t.strides().size(); ++d)
    o.strides[d] = t.strides()[d];
  return o;
}

TEST(CudaKernelsOnHost, ElementwiseFunctionsAreTheCpus) {
  auto& cpu = backend_for(device::cpu());
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    // Positive, so that log, sqrt and pow are defined everywhere.
    const auto a = add(mul(sample({5, 70}, 67, type), 0.5), 1.0);
    const auto b = add(mul(sample({5, 70}, 68, type), 0.5), 1.0);
    const auto space = space_of(a);
    for (int op = 0; op <= static_cast<int>(unary_op::gelu_tanh); ++op) {
      SCOPED_TRACE(fmt::format("unary op {}", op));
      auto want = tensor::empty(a.shape(), type);
      cpu.unary(static_cast<unary_op>(op), a, 1.7, want);
      auto got = tensor::empty(a.shape(), type);
      kernels::launch_unary(static_cast<kernels::unary_kernel>(op), space, operand_of(got), operand_of(a), 1.7,
                            nullptr);
      expect_close(got, want, 10 * tolerance(type));
    }
    for (int op = 0; op <= static_cast<int>(binary_op::gelu_tanh_backward); ++op) {
      SCOPED_TRACE(fmt::format("binary op {}", op));
      auto want = tensor::empty(a.shape(), type);
      cpu.binary(static_cast<binary_op>(op), a, b, want);
      auto got = tensor::empty(a.shape(), type);
      kernels::launch_binary(static_cast<kernels::binary_kernel>(op), space, operand_of(got), operand_of(a),
                             operand_of(b), nullptr);
      expect_close(got, want, 10 * tolerance(type));
    }
    // Strided operands: a transposed view, and a row broadcast down the
    // columns (stride 0), as the backend passes them.
    const auto at = sample({70, 5}, 69, type).t();
    const auto row = sample({5, 1}, 73, type).expand({5, 70});
    auto strided_space = space;
    strided_space.contiguous = false;
    for (auto op : {binary_op::add, binary_op::mul, binary_op::maximum, binary_op::gelu_backward}) {
      SCOPED_TRACE(fmt::format("strided binary op {}", static_cast<int>(op)));
      auto want = tensor::empty(a.shape(), type);
      cpu.binary(op, at, row, want);
      auto got = tensor::empty(a.shape(), type);
      kernels::launch_binary(static_cast<kernels::binary_kernel>(op), strided_space, operand_of(got),
                             operand_of(at), operand_of(row), nullptr);
      expect_close(got, want, 10 * tolerance(type));
    }
    // Conversions, bfloat16 included (rounding to nearest even).
    for (auto to : {dtype::float32, dtype::float64, dtype::bfloat16, dtype::int64}) {
      SCOPED_TRACE(fmt::format("to {}", to));
      auto got = tensor::empty(a.shape(), to);
      kernels::launch_copy(space, operand_of(got), operand_of(a), nullptr);
      EXPECT_EQ(test::values(got), test::values(a.to(to)));
    }
  }
}

/// The strides of a 1-D index read along `dim` (cuda_backend.cpp's along).
std::array<std::int64_t, kernels::max_rank> along(std::int64_t dim, const tensor& index) {
  std::array<std::int64_t, kernels::max_rank> strides{};
  strides[static_cast<std::size_t>(dim)] = index.strides()[0];
  return strides;
}

/// `t`'s index space with `dim` collapsed to one position (cuda_backend.cpp's collapsed).
kernels::index_space lines_of(const tensor& t, std::int64_t dim) {
  auto space = space_of(t);
  space.numel /= t.size(dim);
  space.sizes[dim] = 1;
  space.contiguous = false;
  return space;
}

TEST(CudaKernelsOnHost, IndexedReadsAndAccumulationsAreTheCpus) {
  for (auto type : floating) {
    SCOPED_TRACE(fmt::format("{}", type));
    const auto a = sample({4, 6}, 70, type);
    const auto ids = tensor::from<std::int64_t>({5, 0, 5, 2, 3}, {5}); // repeated
    auto operand_space = [](const tensor& t) {
      auto space = space_of(t);
      space.contiguous = false;
      return space;
    };
    {
      SCOPED_TRACE("index_select along 1");
      auto want = index_select(a, 1, ids);
      auto got = tensor::empty(want.shape(), type);
      kernels::launch_indexed_read(operand_space(got), operand_of(got), operand_of(a), ids.data<std::int64_t>(),
                                   along(1, ids).data(), 1, a.strides()[1], nullptr);
      expect_close(got, want, 0.0);
    }
    {
      SCOPED_TRACE("gather along 0");
      const auto where = tensor::from<std::int64_t>({3, 0, 1, 1, 2, 0, 0, 3, 3, 2, 1, 0}, {2, 6});
      auto want = gather(a, 0, where);
      auto got = tensor::empty(want.shape(), type);
      kernels::launch_indexed_read(operand_space(got), operand_of(got), operand_of(a), where.data<std::int64_t>(),
                                   operand_of(where).strides, 0, a.strides()[0], nullptr);
      expect_close(got, want, 0.0);
    }
    {
      SCOPED_TRACE("scatter_add along 1");
      const auto where = tensor::from<std::int64_t>({1, 1, 4, 0, 5, 5, 2, 2}, {2, 4});
      const auto src = sample({2, 4}, 71, type);
      auto want = scatter_add(a, 1, where, src);
      auto got = a.clone();
      kernels::launch_indexed_accumulate(lines_of(where, 1), where.size(1), operand_of(got), operand_of(src),
                                         where.data<std::int64_t>(), operand_of(where).strides, 1, got.strides()[1],
                                         nullptr);
      expect_close(got, want, tolerance(type));
    }
    {
      SCOPED_TRACE("index_add_ along 0");
      const auto rows = tensor::from<std::int64_t>({2, 0, 2}, {3});
      const auto src = sample({3, 6}, 72, type);
      auto want = a.clone();
      index_add_(want, 0, rows, src);
      auto got = a.clone();
      kernels::launch_indexed_accumulate(lines_of(src, 0), src.size(0), operand_of(got), operand_of(src),
                                         rows.data<std::int64_t>(), along(0, rows).data(), 0, got.strides()[0],
                                         nullptr);
      expect_close(got, want, tolerance(type));
    }
  }
}

// The backend enables no peer access, so on a machine with two GPUs a
// kernel given the other GPU's memory faults; the stand-in refuses it at
// the launch, saying so (what shows a stage that forgot to move a tensor
// onto its own device).
TEST(CudaKernelsOnHost, AKernelGivenAnotherDevicesMemoryIsRefused) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2)
    GTEST_SKIP() << "the stand-in runtime has " << devices << " devices";
  void* mine = nullptr;
  void* other = nullptr;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&other, 64), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&mine, 64), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  kernels::index_space shape;
  shape.rank = 1;
  shape.sizes[0] = 16;
  shape.numel = 16;
  shape.contiguous = true;
  kernels::operand out;
  out.type = kernels::element::float32;
  out.strides[0] = 1;
  out.data = mine;
  EXPECT_NO_THROW(kernels::launch_fill(shape, out, 1.0, stream));
  out.data = other;
  try {
    kernels::launch_fill(shape, out, 1.0, stream);
    ADD_FAILURE() << "a kernel on cuda:0 was launched with cuda:1's memory";
  } catch (const cuda_error& e) {
    EXPECT_NE(std::string(e.what()).find("illegal memory access"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(mine), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaFree(other), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

} // namespace
} // namespace troupe
