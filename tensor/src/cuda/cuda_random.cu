// Random fills of the CUDA backend (cuda_kernels.hpp). Element i depends
// only on (seed, offset + i) through the same Philox functions the CPU
// uses (philox.hpp), so a draw on cuda:N gives the CPU's numbers: exactly
// for uniform, integer and dropout, within float rounding for normal (the
// device's log and cos may differ from glibc's in the last place).
#include "../philox.hpp"
#include "cuda_device_common.cuh"

namespace troupe::detail::cuda {

namespace {

template <class T> __device__ inline T unit_uniform(const std::array<std::uint32_t, 4>& w) {
  if constexpr (std::is_same_v<T, float>)
    return uniform24(w[0]);
  else
    return uniform53(w[0], w[1]);
}

__global__ void fill_integer_kernel(std::uint64_t seed, std::uint64_t start, std::int64_t low,
                                    std::uint64_t range, std::int64_t* out, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto w = philox_at(seed, start + static_cast<std::uint64_t>(i));
    const auto bits = (static_cast<std::uint64_t>(w[0]) << 32) | w[1];
    out[i] = low + static_cast<std::int64_t>(bits % range);
  }
}

__device__ inline float mul_rounded(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rounded(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float add_rounded(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rounded(double a, double b) { return __dadd_rn(a, b); }

template <class T>
__global__ void fill_floating_kernel(distribution what, std::uint64_t seed, std::uint64_t start, double a, double b,
                                     T* out, std::int64_t n) {
  constexpr double two_pi = 6.283185307179586476925286766559;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const auto w = philox_at(seed, start + static_cast<std::uint64_t>(i));
    switch (what) {
      case distribution::uniform: {
        const auto low = static_cast<T>(a);
        const auto high = static_cast<T>(b);
        const auto width = static_cast<T>(b - a);
        // Rounded product then sum, as the CPU computes it: nvcc would fuse
        // them into one fma and round differently.
        const T v = add_rounded(low, mul_rounded(width, unit_uniform<T>(w)));
        // Rounding may land exactly on `high`; keep the interval half-open.
        if constexpr (std::is_same_v<T, float>)
          out[i] = v < high ? v : nextafterf(high, low);
        else
          out[i] = v < high ? v : nextafter(high, low);
        break;
      }
      case distribution::normal: {
        // Box-Muller, cosine branch, in double as on the CPU.
        const double u1 = uniform53(w[0], w[1]);
        const double u2 = uniform53(w[2], w[3]);
        const double radius = sqrt(-2.0 * log(1.0 - u1));
        out[i] = static_cast<T>(a + b * radius * cos(two_pi * u2));
        break;
      }
      case distribution::dropout:
        out[i] = unit_uniform<T>(w) >= static_cast<T>(a) ? static_cast<T>(b) : T(0);
        break;
      case distribution::integer: break;
    }
  }
}

} // namespace

void launch_fill_random(distribution what, element type, std::uint64_t seed, std::uint64_t offset, double a,
                        double b, void* out, std::int64_t n, cudaStream_t stream) {
  const auto blocks = (n + block_size - 1) / block_size;
  if (what == distribution::integer) {
    const auto low = static_cast<std::int64_t>(a);
    const auto range = static_cast<std::uint64_t>(static_cast<std::int64_t>(b) - low);
    launch_blocks(fill_integer_kernel, blocks, block_size, stream, seed, offset, low, range,
                  static_cast<std::int64_t*>(out), n);
    return;
  }
  if (type == element::float32)
    launch_blocks(fill_floating_kernel<float>, blocks, block_size, stream, what, seed, offset, a, b,
                  static_cast<float*>(out), n);
  else
    launch_blocks(fill_floating_kernel<double>, blocks, block_size, stream, what, seed, offset, a, b,
                  static_cast<double*>(out), n);
}

} // namespace troupe::detail::cuda
