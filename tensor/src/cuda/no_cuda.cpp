// cuda.hpp in a build without the CUDA backend (TROUPE_CUDA=OFF or no
// toolkit): no devices, and cuda:N tensors fail in storage::allocate with
// "no backend for device cuda:0 in this build".
#include "troupe/tensor/cuda.hpp"

#include "troupe/tensor/error.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {

bool cuda_backend_built() noexcept {
  return false;
}

int cuda_device_count() noexcept {
  return 0;
}

std::string cuda_unavailable_reason() {
  return "this build has no CUDA backend (configured without the CUDA toolkit or with TROUPE_CUDA=OFF)";
}

std::string cuda_convolution() {
  return "none: this build has no CUDA backend";
}

void cuda_synchronize(device where) {
  throw usage_error(fmt::format("cuda_synchronize: no backend for device {} in this build", where));
}

void cuda_synchronize(const tensor& t) {
  if (t.defined() && t.where().kind == device_kind::cuda)
    cuda_synchronize(t.where());
}

} // namespace troupe
