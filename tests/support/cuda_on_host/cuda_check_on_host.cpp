// throw_cuda_error (tensor/src/cuda/cuda_check.hpp) for the kernels that
// run on the host (cuda_on_host.hpp): a failed call is a test failure.
#include <stdexcept>
#include <string>

#include "cuda_on_host.hpp"
#define troupe troupe_on_host
#include "cuda/cuda_check.hpp"

namespace troupe::detail::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status) + " (" + file + ":" +
                           std::to_string(line) + ")");
}

} // namespace troupe::detail::cuda
