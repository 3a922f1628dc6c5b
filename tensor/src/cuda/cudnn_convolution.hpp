#pragma once
// Private: conv2d and its gradients through cuDNN, for the CUDA backend
// (cuda_backend.cpp), which runs troupe's own kernels (im2col, cuBLAS,
// col2im) wherever these decline.
#include <array>
#include <optional>
#include <string>

#include "troupe/tensor/backend.hpp"

namespace troupe::detail::cuda {

struct execution_stream;

/// Queues out = conv2d(input, weight) (contiguous NCHW, see backend.hpp) on
/// `queue`, whose device is current. False, having queued nothing, when
/// cuDNN does not run this convolution: it cannot be loaded, TROUPE_CUDNN
/// is "off", the dtype is neither float32 nor float64, a size exceeds
/// cuDNN's int, cuDNN cannot make a handle on the device, or it has no
/// deterministic algorithm without TF32 for it (these two said once on
/// stderr).
bool cudnn_conv2d(execution_stream& queue, const tensor& input, const tensor& weight, const conv_geometry& geometry,
                  tensor& out);

/// As cudnn_conv2d, for the gradients of conv2d (backend::conv2d_backward:
/// the input's only where grad_input is defined).
bool cudnn_conv2d_backward(execution_stream& queue, const tensor& grad, const tensor& input, const tensor& weight,
                           const conv_geometry& geometry, tensor& grad_input, tensor& grad_weight);

/// The output shape [n, outputs, out_h, out_w] that cuDNN computes from the
/// descriptors troupe makes for this convolution (no device needed: the
/// tests compare it with troupe's). nullopt where cuDNN is not to run it:
/// not loaded or turned off, the dtype, a size beyond cuDNN's int. Before
/// its first run of a shape, cudnn_conv2d declines it where the two differ.
std::optional<std::array<int, 4>> cudnn_output_shape(const tensor& input, const tensor& weight,
                                                     const conv_geometry& geometry);

/// What runs conv2d on CUDA devices (troupe::cuda_convolution()).
std::string cudnn_convolution_summary();

} // namespace troupe::detail::cuda
