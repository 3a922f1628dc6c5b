#pragma once
// Private: what every CUDA kernel file of the backend shares: bfloat16 as
// stored, dtype conversion, the strided index walk, the element-type
// dispatch and the checked launch. Plain CUDA C++ (no troupe or fmt
// headers), included only by the .cu files.
#include <cstdint>
#include <type_traits>

#include "cuda_check.hpp"
#include "cuda_kernels.hpp"

namespace troupe::detail::cuda {

constexpr int block_size = 256;
// Enough blocks to fill any current GPU; the grid-stride loop does the rest.
constexpr std::int64_t max_blocks = 65535;

/// bfloat16 as stored: the upper half of a float32.
struct bf16 {
  std::uint16_t bits;
};

__device__ inline float to_float(bf16 v) {
  return __uint_as_float(static_cast<std::uint32_t>(v.bits) << 16);
}

// Rounds to nearest, ties to even; NaN stays a quiet NaN (as dtype.hpp).
__device__ inline bf16 to_bf16(float f) {
  auto u = __float_as_uint(f);
  if (f != f)
    return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

template <class To, class From> __device__ inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else if constexpr (std::is_same_v<From, bf16>)
    return static_cast<To>(to_float(v));
  else if constexpr (std::is_same_v<To, bf16>)
    return to_bf16(static_cast<float>(v));
  else
    return static_cast<To>(v);
}

__device__ inline std::int64_t offset_of(std::int64_t i, const index_space& s, const operand& o) {
  if (s.contiguous)
    return i;
  std::int64_t offset = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    const auto size = s.sizes[d];
    offset += (i % size) * o.strides[d];
    i /= size;
  }
  return offset;
}

template <class T> __device__ inline T& at(const operand& o, std::int64_t offset) {
  return static_cast<T*>(o.data)[offset];
}

// Grid-stride loop over the index space.
#define TROUPE_FOR_EACH_INDEX(i, shape)                                                             \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;         \
       i < (shape).numel; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

// Math in the operand's own precision (expf for float32, exp for float64).
template <class T> __device__ inline T exp_of(T x) {
  if constexpr (std::is_same_v<T, float>)
    return expf(x);
  else
    return exp(x);
}

template <class T> __device__ inline T log_of(T x) {
  if constexpr (std::is_same_v<T, float>)
    return logf(x);
  else
    return log(x);
}

template <class T> __device__ inline T sqrt_of(T x) {
  if constexpr (std::is_same_v<T, float>)
    return sqrtf(x);
  else
    return sqrt(x);
}

/// True only for a floating NaN (integers never are).
template <class T> __device__ inline bool is_nan(T x) {
  return x != x;
}

// -- block reductions -----------------------------------------------------------------
//
// Row kernels give a row to one block of a power-of-two number of threads.
// Thread t first folds elements t, t + blockDim, ... in order, then the
// block combines the partial results in a fixed tree: the result depends
// only on the row's values and the block size, which the launchers derive
// from the row length alone.

/// Threads for a row of `length`: a power of two in [32, 256].
inline int threads_for(std::int64_t length) {
  int threads = 32;
  while (threads < 256 && threads < length)
    threads *= 2;
  return threads;
}

/// Shared scratch of the block reductions (256 slots of up to 16 bytes).
__device__ inline void* reduction_scratch() {
  alignas(16) __shared__ unsigned char scratch[256 * 16];
  return scratch;
}

/// Combines every thread's `value` with `op` in a fixed tree; every thread
/// gets the result.
template <class T, class Op> __device__ inline T block_reduce(T value, Op op) {
  auto* shared = static_cast<T*>(reduction_scratch());
  const unsigned tid = threadIdx.x;
  shared[tid] = value;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (tid < half)
      shared[tid] = op(shared[tid], shared[tid + half]);
    __syncthreads();
  }
  T result = shared[0];
  __syncthreads(); // the scratch is reused by the next reduction
  return result;
}

struct plus {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};

template <class T> struct tag {
  using type = T;
};

/// f(tag<T>{}) for the C++ type of any element type.
template <class F> void dispatch_any(element type, F&& f) {
  switch (type) {
    case element::float32: return f(tag<float>{});
    case element::float64: return f(tag<double>{});
    case element::int64: return f(tag<std::int64_t>{});
    case element::int32: return f(tag<std::int32_t>{});
    case element::uint8: return f(tag<std::uint8_t>{});
    case element::bfloat16: return f(tag<bf16>{});
  }
}

/// f(tag<T>{}) for the arithmetic types; the backend checks dtypes first.
template <class F> void dispatch_arithmetic(element type, F&& f) {
  switch (type) {
    case element::float32: return f(tag<float>{});
    case element::float64: return f(tag<double>{});
    case element::int64: return f(tag<std::int64_t>{});
    case element::int32: return f(tag<std::int32_t>{});
    default: break;
  }
}

inline unsigned blocks_for(const index_space& shape) {
  auto blocks = (shape.numel + block_size - 1) / block_size;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

// kernel<<<grid, block, 0, stream>>> as a macro, so that the kernels also
// compile for the host, where CI runs them without a GPU
// (tests/support/cuda_on_host/cuda_on_host.hpp defines it first).
#ifndef TROUPE_LAUNCH
#define TROUPE_LAUNCH(kernel, grid, block, stream) kernel<<<(grid), (block), 0, (stream)>>>
#endif

// A launch reports a bad configuration at once; a fault inside the kernel
// surfaces at the next synchronising call, which is checked too.
template <class... Params, class... Args>
inline void launch(void (*kernel)(Params...), const index_space& shape, cudaStream_t stream, Args... args) {
  if (shape.numel == 0)
    return;
  TROUPE_LAUNCH(kernel, blocks_for(shape), block_size, stream)(args...);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

/// A kernel of its own grid: `blocks` blocks of `threads` (row kernels give
/// each row a block; the block count is capped and rows are strided).
template <class... Params, class... Args>
inline void launch_blocks(void (*kernel)(Params...), std::int64_t blocks, int threads, cudaStream_t stream,
                          Args... args) {
  if (blocks <= 0)
    return;
  TROUPE_LAUNCH(kernel, static_cast<unsigned>(blocks > max_blocks ? max_blocks : blocks), threads, stream)(args...);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

} // namespace troupe::detail::cuda
