#pragma once
// CUDA C++ on the host, so that CI can run the CUDA backend's kernels
// (tensor/src/cuda/*.cu) on a machine without a GPU: in the CUDA backend
// built on the stand-in runtime (troupe_tensor_cuda_on_host; its
// conformance test is tensor.cuda_backend_on_host_test), and directly
// against the CPU backend (tests/tensor/cuda_kernels_on_host_test.cpp).
//
// A launch is queued on its stream (cuda_runtime_api.h); when it runs, its
// grid's blocks run one after another on the thread that runs the stream,
// a block's threads are fibers of that thread, __syncthreads() a switch
// back to the fiber that resumes them all once each has reached it, and
// __shared__ memory a static that the block in flight owns (the runtime
// runs one launch at a time).
// What this checks: the kernels' indexing, masks, reductions, strides and
// launch geometry. What it cannot: anything of the GPU itself (warps, the
// memory model, nvcc's floating-point contractions and math library,
// speed) — that stays with scripts/gpu_check.sh on a device.
//
// Included first by each generated translation unit, which then includes
// one kernel file.
#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <type_traits>
#include <vector>

#include <ucontext.h>

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
/// Whether the calling thread runs a block's threads as fibers.
inline thread_local bool in_fibers = false;
/// Set by __syncthreads() in a launch run on fibers.
inline bool barrier_called = false;

/// Kernels whose first launch, run on fibers, never called
/// __syncthreads(): their later launches run thread after thread, without
/// the fibers (a fiber started per element of an elementwise kernel costs
/// seconds over a few million). Used under the runtime's lock, which runs
/// one launch at a time.
inline std::map<const void*, bool>& barrier_free_kernels() {
  static std::map<const void*, bool> kernels;
  return kernels;
}

/// A block's threads as fibers on the calling thread: each runs until it
/// reaches __syncthreads() or returns, then the next; when all have, those
/// waiting go on together. No host threads, so a block of 256 costs no
/// context switches of the machine (host threads made every barrier wake
/// 256 of them on two cores).
struct block_fibers {
  static constexpr std::size_t stack_bytes = std::size_t{128} << 10;

  struct fiber {
    ucontext_t context;
    uint3 index;
    bool finished = false;
  };

  ucontext_t scheduler;
  std::vector<fiber> fibers;
  std::unique_ptr<char[]> stacks; // not value-initialised: pages are touched only as used
  std::size_t stack_count = 0;
  fiber* running = nullptr;
  const std::function<void()>* body = nullptr;

  static block_fibers& of_this_thread() {
    static thread_local block_fibers instance;
    return instance;
  }

  static void entry() {
    auto& self = of_this_thread();
    (*self.body)();
    self.running->finished = true; // returns to `scheduler` (uc_link)
  }

  /// Runs one block of `threads` threads (block_index already set).
  void run_block(dim3 block, const std::function<void()>& work) {
    const unsigned threads = block.x * block.y * block.z;
    if (stack_count < threads) {
      stacks.reset(new char[threads * stack_bytes]);
      stack_count = threads;
    }
    fibers.resize(threads);
    body = &work;
    for (unsigned t = 0; t < threads; ++t) {
      auto& f = fibers[t];
      f.index = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
      f.finished = false;
      getcontext(&f.context);
      f.context.uc_stack.ss_sp = stacks.get() + t * stack_bytes;
      f.context.uc_stack.ss_size = stack_bytes;
      f.context.uc_link = &scheduler;
      makecontext(&f.context, &block_fibers::entry, 0);
    }
    for (unsigned remaining = threads; remaining > 0;) {
      for (auto& f : fibers) {
        if (f.finished)
          continue;
        running = &f;
        thread_index = f.index;
        swapcontext(&scheduler, &f.context);
        if (f.finished)
          --remaining;
      }
    }
    running = nullptr;
  }

  /// __syncthreads() of the running fiber: back to the scheduler.
  void wait_at_barrier() { swapcontext(&running->context, &scheduler); }
};

/// Runs the whole grid of `kernel` with `args`, block after block, each
/// block's threads as fibers (block_fibers).
template <class... Params, class... Args>
void run_grid_on_fibers(void (*kernel)(Params...), dim3 grid, dim3 block, const Args&... args) {
  const unsigned blocks = grid.x * grid.y * grid.z;
  block_dim = block;
  grid_dim = grid;
  auto& fibers = block_fibers::of_this_thread();
  const std::function<void()> work = [&] { kernel(args...); };
  in_fibers = true;
  for (unsigned b = 0; b < blocks; ++b) {
    block_index = {b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y)};
    fibers.run_block(block, work);
  }
  in_fibers = false;
}

/// The grid on the calling thread, block after block and thread after
/// thread; a __syncthreads() here is fatal (see barrier_free_kernels).
template <class... Params, class... Args>
void run_grid_alone(void (*kernel)(Params...), dim3 grid, dim3 block, const Args&... args) {
  const unsigned threads = block.x * block.y * block.z;
  const unsigned blocks = grid.x * grid.y * grid.z;
  block_dim = block;
  grid_dim = grid;
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
  run_grid_on_fibers(kernel, grid, block, args...);
  known[key] = !barrier_called;
}

/// The memory a kernel argument points into: a pointer's, or the `data`
/// of a struct that carries one (the kernels' operand); null otherwise.
template <class A> const void* memory_of(const A& argument) {
  if constexpr (std::is_pointer_v<A>)
    return argument;
  else if constexpr (requires { { argument.data } -> std::convertible_to<const void*>; })
    return argument.data;
  else
    return nullptr;
}

/// kernel<<<grid, block, 0, stream>>>(args...) on the host: the returned
/// callable takes the arguments and queues the grid on `stream`. A
/// geometry CUDA refuses, a stream of another device than the current
/// one, or an argument in another device's memory, is refused here too,
/// as cudaGetLastError then says.
template <class... Params> auto launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream) {
  return [=](auto... args) {
    const bool refused = block.x * block.y * block.z == 0 || block.x * block.y * block.z > 1024 || block.z > 64 ||
                         grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535;
    if (refused) {
      set_last_error(cudaErrorInvalidConfiguration);
      return;
    }
    if (!may_launch_on(stream) || !may_access_from(stream, {memory_of(args)...}))
      return;
    launching();
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
  if (!cuda_on_host::in_fibers) {
    std::fputs("cuda_on_host: a kernel called __syncthreads() in a launch run on one thread, though its first "
               "launch never did (cuda_on_host.hpp, barrier_free_kernels)\n",
               stderr);
    std::abort();
  }
  cuda_on_host::barrier_called = true;
  cuda_on_host::block_fibers::of_this_thread().wait_at_barrier();
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
