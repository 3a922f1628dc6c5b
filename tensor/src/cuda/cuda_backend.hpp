#pragma once
// Private: the CUDA backend, registered for device_kind::cuda by
// backend.cpp in builds with TROUPE_HAVE_CUDA.
//
// Every kernel of backend.hpp runs on the device: troupe's own kernels
// (cuda_kernels.hpp) for elementwise functions, reductions, softmax (plain
// and causal), cross entropy, layer norm, indexing, embedding bags, im2col,
// col2im, pooling, Philox draws and the optimizer steps; cuBLAS for GEMM and
// batched GEMM; cuDNN for convolutions where it is found
// (cudnn_convolution.hpp). Causal attention is the backend's default: bmm
// and the causal softmax, composed on the device.
#include "troupe/tensor/backend.hpp"

namespace troupe::detail {

/// The process-wide instance. Constructing it touches no CUDA API.
backend& cuda_backend_instance();

} // namespace troupe::detail
