#pragma once
// CUDA C++ on the host, so that CI can run the CUDA backend's kernels
// (tensor/src/cuda/*.cu) on a machine without a GPU and compare them with
// the CPU backend (tests/tensor/cuda_kernels_on_host_test.cpp).
//
// A launch runs its grid's blocks one after another; a block's threads are
// host threads, __syncthreads() a barrier among them, and __shared__
// memory a static that the block in flight owns (one launch at a time). What this checks: the
// kernels' indexing, masks, reductions, strides and launch geometry. What it
// cannot: anything of the GPU itself (warps, the memory model, nvcc's
// floating-point contractions and math library, speed) — that stays with
// scripts/gpu_check.sh on a device.
//
// Included first by each generated translation unit, which then includes
// one kernel file with `troupe` renamed `troupe_on_host`, so that these
// kernels stand beside the real CUDA backend's in one test program.
#include <algorithm>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __shared__ static

namespace cuda_on_host {

inline thread_local uint3 thread_index{0, 0, 0};
inline thread_local uint3 block_index{0, 0, 0};
inline thread_local dim3 block_dim;
inline thread_local dim3 grid_dim;
inline thread_local std::barrier<>* block_barrier = nullptr;

/// kernel<<<grid, block>>>(args...) on the host: the returned callable
/// takes the arguments and runs the whole grid before it returns. One host
/// thread per thread of a block runs that thread of every block in turn;
/// a barrier ends each block, so the next reuses its shared memory only
/// after all of it ran.
template <class... Params> auto launch(void (*kernel)(Params...), dim3 grid, dim3 block) {
  return [=](auto... args) {
    const unsigned threads = block.x * block.y * block.z;
    const unsigned blocks = grid.x * grid.y * grid.z;
    std::barrier<> barrier(threads);
    std::vector<std::thread> team;
    team.reserve(threads);
    for (unsigned t = 0; t < threads; ++t)
      team.emplace_back([&, t] {
        thread_index = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
        block_dim = block;
        grid_dim = grid;
        block_barrier = &barrier;
        for (unsigned b = 0; b < blocks; ++b) {
          block_index = {b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y)};
          kernel(args...);
          barrier.arrive_and_wait();
        }
      });
    for (auto& thread : team)
      thread.join();
  };
}

} // namespace cuda_on_host

#define threadIdx ::cuda_on_host::thread_index
#define blockIdx ::cuda_on_host::block_index
#define blockDim ::cuda_on_host::block_dim
#define gridDim ::cuda_on_host::grid_dim
#define TROUPE_LAUNCH(kernel, grid, block, stream) \
  (static_cast<void>(stream), ::cuda_on_host::launch(kernel, dim3(grid), dim3(block)))

// CUDA's math library overloads min and max for integers.
using std::max;
using std::min;

inline void __syncthreads() {
  cuda_on_host::block_barrier->arrive_and_wait();
}

inline float __uint_as_float(unsigned bits) {
  return std::bit_cast<float>(bits);
}
inline unsigned __float_as_uint(float value) {
  return std::bit_cast<unsigned>(value);
}
// Rounded once each: the host compiles these files without contraction
// (no FMA is enabled), as the _rn intrinsics promise on the device.
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __dadd_rn(double a, double b) {
  return a + b;
}
