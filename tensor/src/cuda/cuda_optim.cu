// Fused optimizer steps of the CUDA backend (cuda_kernels.hpp): one pass
// over a parameter, its gradient and its state per step, computing what the
// CPU's element loops compute (autograd/src/optim/adam.cpp and sgd.cpp):
// Adam in double per element, SGD in the parameter's precision. Composed
// of tensor ops, the same step took about fifteen passes and most of a wide
// GPT's step time outside GEMM.
#include "cuda_device_common.cuh"

namespace troupe::detail::cuda {

namespace {

template <class T>
__global__ void adam_step_kernel(T* p, const T* g, T* m, T* v, std::int64_t n, adam_scalars s) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const double pi = static_cast<double>(p[i]);
    const double gi = static_cast<double>(g[i]) + s.l2 * pi;
    const double mi = s.beta1 * static_cast<double>(m[i]) + (1.0 - s.beta1) * gi;
    const double vi = s.beta2 * static_cast<double>(v[i]) + (1.0 - s.beta2) * gi * gi;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(pi * s.decay - s.step_size * mi / (sqrt(vi) / s.bias_correction2_sqrt + s.eps));
  }
}

template <class T>
__global__ void sgd_step_kernel(T* p, const T* g, T* buffer, std::int64_t n, sgd_scalars s) {
  const T lr = static_cast<T>(s.lr);
  const T decay = static_cast<T>(s.weight_decay);
  const T momentum = static_cast<T>(s.momentum);
  const T keep = static_cast<T>(1.0 - s.dampening);
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const T d = decay == T(0) ? g[i] : T(g[i] + decay * p[i]);
    if (buffer == nullptr) {
      p[i] -= lr * d;
      continue;
    }
    const T b = s.first ? d : T(momentum * buffer[i] + keep * d);
    buffer[i] = b;
    p[i] -= lr * (s.nesterov ? T(d + momentum * b) : b);
  }
}

std::int64_t blocks_for_count(std::int64_t n) {
  return (n + block_size - 1) / block_size;
}

} // namespace

void launch_adam_step(element type, void* param, const void* grad, void* m, void* v, std::int64_t n,
                      const adam_scalars& s, cudaStream_t stream) {
  if (type == element::float32)
    launch_blocks(adam_step_kernel<float>, blocks_for_count(n), block_size, stream, static_cast<float*>(param),
                  static_cast<const float*>(grad), static_cast<float*>(m), static_cast<float*>(v), n, s);
  else
    launch_blocks(adam_step_kernel<double>, blocks_for_count(n), block_size, stream, static_cast<double*>(param),
                  static_cast<const double*>(grad), static_cast<double*>(m), static_cast<double*>(v), n, s);
}

void launch_sgd_step(element type, void* param, const void* grad, void* buffer, std::int64_t n,
                     const sgd_scalars& s, cudaStream_t stream) {
  if (type == element::float32)
    launch_blocks(sgd_step_kernel<float>, blocks_for_count(n), block_size, stream, static_cast<float*>(param),
                  static_cast<const float*>(grad), static_cast<float*>(buffer), n, s);
  else
    launch_blocks(sgd_step_kernel<double>, blocks_for_count(n), block_size, stream, static_cast<double*>(param),
                  static_cast<const double*>(grad), static_cast<double*>(buffer), n, s);
}

} // namespace troupe::detail::cuda
