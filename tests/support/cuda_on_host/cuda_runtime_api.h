#pragma once
// Stands in for CUDA's runtime header where the CUDA backend's kernels are
// compiled for the host (cuda_on_host.hpp): the few types and calls their
// launchers use. Device memory is host memory, a stream is nothing, and
// every call completes before it returns.
#include <cstddef>
#include <cstdlib>
#include <cstring>

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

enum cudaError_t { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };

struct cuda_on_host_stream;
using cudaStream_t = cuda_on_host_stream*;

inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}

inline const char* cudaGetErrorString(cudaError_t status) {
  return status == cudaSuccess ? "no error" : "out of memory";
}

inline cudaError_t cudaMallocAsync(void** pointer, std::size_t bytes, cudaStream_t) {
  *pointer = std::malloc(bytes == 0 ? 1 : bytes);
  return *pointer != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

template <class T> cudaError_t cudaMallocAsync(T** pointer, std::size_t bytes, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(pointer), bytes, stream);
}

inline cudaError_t cudaFreeAsync(void* pointer, cudaStream_t) {
  std::free(pointer);
  return cudaSuccess;
}

inline cudaError_t cudaMemsetAsync(void* pointer, int value, std::size_t bytes, cudaStream_t) {
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}
