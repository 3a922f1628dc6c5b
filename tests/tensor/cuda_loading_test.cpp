// cuBLAS is opened when a CUDA device first multiplies, not at start
// (tensor/src/cuda/cublas_library.hpp): loading it costs a process about
// 210 MB of resident memory, and a CPU-only program must not pay that.
// cuDNN likewise, when a device first convolves (cudnn_library.hpp).
// The tests that a CPU program loads neither come first: gtest runs a
// file's tests in order, and the later ones load both.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gmock/gmock.h>

#include <gtest/gtest.h>

#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe {
namespace {

/// Whether a file whose name contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos)
      return true;
  return false;
}

TEST(CudaLoading, ACpuProgramNeverLoadsCublas) {
  generator gen{1};
  auto product = matmul(randn({64, 64}, gen), randn({64, 64}, gen));
  EXPECT_EQ(product.shape(), (dims{64, 64}));
  (void)cuda_device_count(); // asks the CUDA runtime, which is linked
  EXPECT_FALSE(mapped("libcublas")) << "cuBLAS was loaded by a program that multiplied only on the CPU";
}

TEST(CudaLoading, ACpuProgramNeverLoadsCudnn) {
  generator gen{3};
  auto input = randn({2, 3, 8, 8}, gen);
  auto weight = randn({4, 3, 3, 3}, gen);
  auto out = conv2d(input, weight, tensor{}, conv2d_options{1, 1});
  auto grads = conv2d_backward(out, input, weight, false, conv2d_options{1, 1});
  EXPECT_EQ(grads.weight.shape(), weight.shape());
  (void)cuda_device_count();
  EXPECT_FALSE(mapped("libcudnn")) << "cuDNN was loaded by a program that convolved only on the CPU";
}

// Asking what runs CUDA convolutions opens cuDNN, which needs no device:
// here that checks that the library is found, is of the build's major
// version and has every function troupe calls.
TEST(CudaLoading, SaysWhatRunsConvolutionsOnCuda) {
  const auto summary = cuda_convolution();
  std::printf("conv2d on CUDA: %s\n", summary.c_str());
#ifdef TROUPE_TEST_EXPECTS_CUDNN
  EXPECT_THAT(summary, ::testing::StartsWith("cuDNN 9."));
  EXPECT_TRUE(mapped("libcudnn"));
#else
  EXPECT_THAT(summary, ::testing::AnyOf(::testing::HasSubstr("this build has no cuDNN"),
                                         ::testing::HasSubstr("this build has no CUDA backend")));
#endif
}

TEST(CudaLoading, TroupeCudnnOffLeavesConvolutionsToTroupesKernels) {
  // A fresh process (threadsafe death tests re-run the binary): the choice
  // is read once per process.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
    {
      ::setenv("TROUPE_CUDNN", "off", 1);
      std::fprintf(stderr, "%s\n", cuda_convolution().c_str());
      std::exit(0);
    },
    ::testing::ExitedWithCode(0),
#ifdef TROUPE_TEST_EXPECTS_CUDNN
    "troupe's kernels .*cuDNN turned off by TROUPE_CUDNN"
#else
    "no cuDNN|no CUDA backend"
#endif
  );
}

TEST(CudaLoading, TheFirstProductOnADeviceOpensCublas) {
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  generator gen{2};
  auto a = randn({32, 16}, gen);
  auto b = randn({16, 8}, gen);
  auto on_device = matmul(a.to(device::cuda(0)), b.to(device::cuda(0)));
  EXPECT_TRUE(mapped("libcublas"));
  EXPECT_TRUE(allclose(on_device.to(device::cpu()), matmul(a, b), 1e-4, 1e-5));
}

TEST(CudaLoading, AConvolutionOnADeviceRunsInCudnn) {
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
#ifndef TROUPE_TEST_EXPECTS_CUDNN
  GTEST_SKIP() << "this build has no cuDNN";
#else
  if (const char* choice = std::getenv("TROUPE_CUDNN"); choice != nullptr)
    GTEST_SKIP() << "TROUPE_CUDNN=" << choice << " is set";
  generator gen{4};
  auto input = randn({2, 3, 9, 9}, gen);
  auto weight = randn({5, 3, 3, 3}, gen);
  // cuDNN runs it unless it declines, which it says on stderr.
  ::testing::internal::CaptureStderr();
  auto on_device = conv2d(input.to(device::cuda(0)), weight.to(device::cuda(0)), tensor{}, conv2d_options{2, 1});
  auto host = on_device.to(device::cpu());
  const auto said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(said, "");
  EXPECT_TRUE(mapped("libcudnn"));
  EXPECT_TRUE(allclose(host, conv2d(input, weight, tensor{}, conv2d_options{2, 1}), 1e-4, 1e-5));
#endif
}

} // namespace
} // namespace troupe
