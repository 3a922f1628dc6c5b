// The emulated CUDA device (tests/support/emulated_device.hpp) behaves as a
// GPU's memory does toward host code: its tensors carry addresses that the
// host cannot touch, and only the backend's copies and kernels reach the
// bytes behind them. So the placement tests that run on it catch host code
// reading a device tensor's memory, as a real device would.
#include "emulated_device.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "troupe/tensor/ops.hpp"

namespace troupe {
namespace {

class EmulatedDevice : public ::testing::Test {
protected:
  void SetUp() override {
    if (cuda_device_count() > 0)
      GTEST_SKIP() << "a real CUDA device is present; these tests are about the emulated one";
  }
  test::emulated_cuda_scope scope_{2};
};

TEST_F(EmulatedDevice, CopiesAndKernelsReachTheHostMemoryBehindAnUntouchableAddress) {
  const auto host = tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const auto on_device = host.to(device::cuda(1));
  ASSERT_EQ(on_device.where(), device::cuda(1));
  EXPECT_TRUE(test::emulated_address_space::instance().contains(on_device.raw_data()));
  EXPECT_FALSE(test::emulated_address_space::instance().contains(host.raw_data()));
  // A kernel on the device, then the way back.
  const auto doubled = add(on_device, on_device).to(device::cpu());
  EXPECT_EQ(doubled.to_vector<float>(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  // A view at an offset copies from inside its block.
  EXPECT_EQ(on_device.slice(0, 1, 2).to(device::cpu()).to_vector<float>(), (std::vector<float>{4, 5, 6}));
  // Between ordinals, through the backend's copy.
  EXPECT_EQ(on_device.to(device::cuda(0)).to(device::cpu()).to_vector<float>(), host.to_vector<float>());
  EXPECT_GE(scope_.backend().transfers(), 4);
}

TEST_F(EmulatedDevice, AFreedAddressIsHandedOutAgain) {
  void* first = nullptr;
  {
    auto t = tensor::zeros({1000}, dtype::float32, device::cuda(0));
    first = t.raw_data();
  }
  auto again = tensor::zeros({1000}, dtype::float32, device::cuda(0));
  EXPECT_EQ(again.raw_data(), first) << "freed blocks are reused, so the reserved range is never used up";
}

TEST_F(EmulatedDevice, AnAddressPastItsHostBlockIsRefused) {
  // 1100 bytes: the address range is 2048 bytes, the host block only the
  // bytes asked for rounded to storage::alignment.
  auto t = tensor::zeros({275}, dtype::float32, device::cuda(0));
  auto* first = static_cast<std::byte*>(t.raw_data());
  const auto held = (std::size_t{1100} + storage::alignment - 1) / storage::alignment * storage::alignment;
  EXPECT_NO_THROW((void)test::emulated_address_space::instance().host_of(first + held - 1));
  EXPECT_THROW((void)test::emulated_address_space::instance().host_of(first + held), usage_error);
}

using EmulatedDeviceDeathTest = EmulatedDevice;

TEST_F(EmulatedDeviceDeathTest, HostCodeReadingDeviceMemoryFaultsAndSaysSo) {
  auto on_device = tensor::full({4}, 7.0, dtype::float32, device::cuda(0));
  EXPECT_DEATH(
    {
      volatile float seen = on_device.data<float>()[0];
      (void)seen;
    },
    "emulated cuda: host code read or wrote device memory");
  EXPECT_DEATH(on_device.data<float>()[1] = 1.0F, "emulated cuda: host code read or wrote device memory");
  // The backend itself still reaches it.
  EXPECT_EQ(on_device.to(device::cpu()).to_vector<float>(), (std::vector<float>(4, 7.0F)));
}

} // namespace
} // namespace troupe
