#pragma once
// What the CUDA backend can offer this process. Everything else about CUDA
// stays inside tensor/src/cuda/: tensors on `cuda:N` are made and moved
// with the ordinary API (`tensor::zeros(shape, type, device::cuda(0))`,
// `t.to(device::cuda(0))`, `t.to(device::cpu())`).
//
// Every function here is safe to call in a build without CUDA, on a machine
// without a driver or without a device: they report "none" instead of
// throwing.
#include <stdexcept>
#include <string>

#include "troupe/tensor/device.hpp"
#include "troupe/tensor/fwd.hpp"

namespace troupe {

/// A CUDA runtime or library call failed (out of memory, a failed launch,
/// a lost device). The message names the call and the runtime's reason:
/// `cudaMallocAsync(&data, bytes, stream) failed on cuda:0: out of memory`.
class cuda_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// True when this build compiled and registered the CUDA backend.
bool cuda_backend_built() noexcept;

/// Number of CUDA devices this process can use; 0 without the backend, a
/// driver or a device. Never throws.
int cuda_device_count() noexcept;

/// Why there is no CUDA device ("" when there is one), for skip messages
/// and errors: "this build has no CUDA backend", or the runtime's answer
/// ("cudaGetDeviceCount: CUDA driver version is insufficient for CUDA
/// runtime version").
std::string cuda_unavailable_reason();

/// What runs conv2d and its gradients on CUDA devices, for benchmark
/// reports and bug reports: "cuDNN 9.19.0 (deterministic algorithms, no
/// TF32; ...)", or troupe's own kernels and why not cuDNN (none in this
/// build, it cannot be loaded, or TROUPE_CUDNN=off in the environment).
/// Loads cuDNN when this build has it. Never throws.
std::string cuda_convolution();

/// Blocks until every kernel and copy the calling thread queued on `where`
/// has finished (each thread queues its work on a device onto a stream of
/// its own). Throws cuda_error when that work failed, usage_error when
/// `where` is not an available CUDA device.
void cuda_synchronize(device where);

/// Blocks until the work queued so far that uses `t`'s memory has finished,
/// whichever thread queued it (for code that hands device memory to a
/// library with its own stream, as NCCL). Does nothing for a CPU tensor.
void cuda_synchronize(const tensor& t);

} // namespace troupe
