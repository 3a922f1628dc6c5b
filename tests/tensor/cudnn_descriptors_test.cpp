// The descriptors troupe gives cuDNN for a convolution (tensor/src/cuda/
// cudnn_convolution.cpp) say troupe's convolution: for many geometries,
// cuDNN computes from them the output shape troupe's conv2d has. cuDNN
// reads descriptors without a device, so this runs on every machine whose
// build has cuDNN; it skips, saying so, elsewhere. (Running convolutions in
// cuDNN needs a device: tensor.cuda_backend_test.)
#include <cstdlib>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/ops.hpp"
#ifdef TROUPE_TEST_EXPECTS_CUDNN
#include "cuda/cudnn_convolution.hpp"
#endif

namespace troupe {
namespace {

#ifndef TROUPE_TEST_EXPECTS_CUDNN
TEST(CudnnDescriptors, NeedABuildWithCudnn) {
  GTEST_SKIP() << "this build has no cuDNN";
}
#else
struct convolution {
  dims input;  // n, c, h, w
  dims weight; // outputs, c, kh, kw
  std::int64_t stride;
  std::int64_t padding;
};

/// The geometry the backend is given (ops_nn.cpp's conv_check).
conv_geometry geometry_of(const convolution& c) {
  conv_geometry g;
  g.channels = c.input[1];
  g.height = c.input[2];
  g.width = c.input[3];
  g.kernel_h = c.weight[2];
  g.kernel_w = c.weight[3];
  g.stride = c.stride;
  g.padding = c.padding;
  g.out_h = (g.height + 2 * g.padding - g.kernel_h) / g.stride + 1;
  g.out_w = (g.width + 2 * g.padding - g.kernel_w) / g.stride + 1;
  return g;
}

class CudnnDescriptors : public ::testing::Test {
protected:
  void SetUp() override {
    if (const char* choice = std::getenv("TROUPE_CUDNN"); choice != nullptr)
      GTEST_SKIP() << "TROUPE_CUDNN=" << choice << " is set";
  }
};

TEST_F(CudnnDescriptors, SayTroupesOutputShapeForEveryGeometry) {
  // Square and rectangular kernels, images and batches; strides 1 to 3 and
  // paddings 0 to 3, so that swapping any two of the sizes troupe passes
  // gives another shape somewhere.
  const std::vector<convolution> convolutions{
    {{2, 3, 14, 14}, {8, 3, 3, 3}, 1, 1},   {{2, 3, 14, 14}, {8, 3, 3, 3}, 2, 1},
    {{1, 16, 7, 9}, {4, 16, 1, 1}, 1, 0},   {{5, 2, 11, 6}, {3, 2, 2, 3}, 2, 1},
    {{3, 4, 9, 9}, {6, 4, 5, 5}, 3, 3},     {{1, 1, 5, 17}, {2, 1, 5, 1}, 1, 2},
    {{4, 6, 32, 32}, {12, 6, 3, 3}, 1, 0},  {{2, 8, 10, 13}, {7, 8, 4, 2}, 3, 2},
  };
  generator gen{9};
  for (const auto& c : convolutions) {
    SCOPED_TRACE(fmt::format("input {} weight {} stride {} padding {}", c.input, c.weight, c.stride, c.padding));
    const auto input = randn(c.input, gen);
    const auto weight = randn(c.weight, gen);
    const auto troupes = conv2d(input, weight, tensor{}, conv2d_options{c.stride, c.padding}).shape();
    const auto g = geometry_of(c);
    ASSERT_EQ((dims{c.input[0], c.weight[0], g.out_h, g.out_w}), troupes);
    for (auto type : {dtype::float32, dtype::float64}) {
      SCOPED_TRACE(fmt::format("{}", type));
      const auto cudnns = detail::cuda::cudnn_output_shape(input.to(type), weight.to(type), g);
      ASSERT_TRUE(cudnns.has_value());
      EXPECT_EQ((dims{(*cudnns)[0], (*cudnns)[1], (*cudnns)[2], (*cudnns)[3]}), troupes);
    }
  }
}

TEST_F(CudnnDescriptors, AreNotMadeForWhatCudnnDoesNotRun) {
  const convolution c{{1, 2, 6, 6}, {3, 2, 3, 3}, 1, 0};
  const auto g = geometry_of(c);
  // bfloat16: troupe's kernels run it.
  EXPECT_FALSE(detail::cuda::cudnn_output_shape(tensor::zeros(c.input, dtype::bfloat16),
                                                tensor::zeros(c.weight, dtype::bfloat16), g)
                 .has_value());
  // A size beyond cuDNN's int.
  auto wide = g;
  wide.width = std::int64_t{1} << 31;
  EXPECT_FALSE(detail::cuda::cudnn_output_shape(tensor::zeros(c.input), tensor::zeros(c.weight), wide).has_value());
}
#endif

} // namespace
} // namespace troupe
