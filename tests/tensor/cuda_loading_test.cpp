// cuBLAS is opened when a CUDA device first multiplies, not at start
// (tensor/src/cuda/cublas_library.hpp): loading it costs a process about
// 210 MB of resident memory, and a CPU-only program must not pay that.
#include <fstream>
#include <string>

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

} // namespace
} // namespace troupe
