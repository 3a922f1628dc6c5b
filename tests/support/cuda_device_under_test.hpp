#pragma once
// Which device a test's CUDA cases run on.
#include <cstdlib>

#include "troupe/tensor/device.hpp"

namespace troupe::test {

/// cuda:0, or the device TROUPE_TEST_CUDA_DEVICE names. On cuda:1 the cases
/// show that every op makes its device current itself: the test's thread
/// leaves cuda:0 current throughout.
inline device cuda_device_under_test() {
  const char* ordinal = std::getenv("TROUPE_TEST_CUDA_DEVICE");
  return device::cuda(ordinal != nullptr ? std::atoi(ordinal) : 0);
}

} // namespace troupe::test
