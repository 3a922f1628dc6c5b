#pragma once
// CUDA C++ on the host, so that CI can run the CUDA backend's kernels
// (tensor/src/cuda/*.cu) on a machine without a GPU: in the CUDA backend
// built on the stand-in runtime (troupe_tensor_cuda_on_host; its
// conformance test is tensor.cuda_backend_test.on_host), and directly
// against the CPU backend (tests/tensor/cuda_kernels_on_host_test.cpp).
//
// A launch is queued on its stream (cuda_runtime_api.h); when it runs, its
// grid's blocks run one after another, a block's threads are host threads,
// __syncthreads() a barrier among them, and __shared__ memory a static
// that the block in flight owns (the runtime runs one launch at a time).
// What this checks: the kernels' indexing, masks, reductions, strides and
// launch geometry. What it cannot: anything of the GPU itself (warps, the
// memory model, nvcc's floating-point contractions and math library,
// speed) — that stays with scripts/gpu_check.sh on a device.
//
// Included first by each generated translation unit, which then includes
// one kernel file.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
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
/// Set by __syncthreads() in a launch run on a team of threads.
inline std::atomic<bool> barrier_called{false};

/// Kernels whose first launch, run on a team of threads, never called
/// __syncthreads(): their later launches run on the calling thread alone,
/// thread after thread, instead of switching among 256 host threads at
/// every block (seconds for one elementwise kernel over a million
/// elements). Used under the runtime's lock, which runs one launch at a
/// time.
inline std::map<const void*, bool>& barrier_free_kernels() {
  static std::map<const void*, bool> kernels;
  return kernels;
}

/// Runs the whole grid of `kernel` with `args`. On a team: one host thread
/// per thread of a block runs that thread of every block in turn, and a
/// barrier ends each block, so the next reuses its shared memory only after
/// all of it ran.
template <class... Params, class... Args>
void run_grid_on_team(void (*kernel)(Params...), dim3 grid, dim3 block, const Args&... args) {
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
}

/// The grid on the calling thread, block after block and thread after
/// thread; a __syncthreads() here is fatal (see barrier_free_kernels).
template <class... Params, class... Args>
void run_grid_alone(void (*kernel)(Params...), dim3 grid, dim3 block, const Args&... args) {
  const unsigned threads = block.x * block.y * block.z;
  const unsigned blocks = grid.x * grid.y * grid.z;
  block_dim = block;
  grid_dim = grid;
  block_barrier = nullptr;
  for (unsigned b = 0; b < blocks; ++b) {
    block_index = {b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y)};
    for (unsigned t = 0; t < threads; ++t) {
      thread_index = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
      kernel(args...);
    }
  }
}

template <class... Params, class... Args>
void run_grid(void (*kernel)(Params...), dim3 grid, dim3 block, const Args&... args) {
  const auto* key = reinterpret_cast<const void*>(kernel);
  auto& known = barrier_free_kernels();
  if (auto found = known.find(key); found != known.end() && found->second) {
    run_grid_alone(kernel, grid, block, args...);
    return;
  }
  barrier_called = false;
  run_grid_on_team(kernel, grid, block, args...);
  known[key] = !barrier_called;
}

/// kernel<<<grid, block, 0, stream>>>(args...) on the host: the returned
/// callable takes the arguments and queues the grid on `stream`. A
/// geometry CUDA refuses is refused here too, as cudaGetLastError then
/// says.
template <class... Params> auto launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream) {
  return [=](auto... args) {
    const bool refused = block.x * block.y * block.z == 0 || block.x * block.y * block.z > 1024 || block.z > 64 ||
                         grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535;
    if (refused) {
      set_last_error(cudaErrorInvalidConfiguration);
      return;
    }
    enqueue(stream, [=] { run_grid(kernel, grid, block, args...); });
  };
}

} // namespace cuda_on_host

#define threadIdx ::cuda_on_host::thread_index
#define blockIdx ::cuda_on_host::block_index
#define blockDim ::cuda_on_host::block_dim
#define gridDim ::cuda_on_host::grid_dim
#define TROUPE_LAUNCH(kernel, grid, block, stream) ::cuda_on_host::launch(kernel, dim3(grid), dim3(block), stream)

// CUDA's math library overloads min and max for integers.
using std::max;
using std::min;

inline void __syncthreads() {
  if (cuda_on_host::block_barrier == nullptr) {
    std::fputs("cuda_on_host: a kernel called __syncthreads() in a launch run on one thread, though its first "
               "launch never did (cuda_on_host.hpp, barrier_free_kernels)\n",
               stderr);
    std::abort();
  }
  cuda_on_host::barrier_called.store(true, std::memory_order_relaxed);
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
