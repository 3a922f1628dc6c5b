#pragma once
// Private: every CUDA runtime call in troupe goes through TROUPE_CUDA_CHECK,
// which throws troupe::cuda_error naming the call, the runtime's reason and
// where it was made (llm.c's rule: launchers check every call). Kept free of
// fmt and troupe headers so that nvcc compiles it quickly (cuda_kernels.cu).
#include <cuda_runtime_api.h>

namespace troupe::detail::cuda {

/// Throws cuda_error "<call> failed: <cudaGetErrorString> (<file>:<line>)"
/// after clearing the runtime's (non-sticky) last error.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    throw_cuda_error(status, call, file, line);
}

} // namespace troupe::detail::cuda

#define TROUPE_CUDA_CHECK(call) ::troupe::detail::cuda::check_cuda((call), #call, __FILE__, __LINE__)
