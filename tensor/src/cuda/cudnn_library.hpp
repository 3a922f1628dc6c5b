#pragma once
// Private: the cuDNN functions the CUDA backend's convolutions call, opened
// on first use like cuBLAS (cublas_library.hpp says why): a CPU-only rank
// never loads it, and a machine without cuDNN still runs the CUDA backend,
// with troupe's own convolution kernels. These are cuDNN's legacy
// convolution functions: they are in every cuDNN 9, and the graph API's C
// form would take several times the code for the same three calls.
#include <string>

#include <cudnn.h>

namespace troupe::detail::cuda {

struct cudnn_library {
  decltype(&::cudnnGetVersion) get_version;
  decltype(&::cudnnGetErrorString) error_string;
  decltype(&::cudnnCreate) create;
  decltype(&::cudnnDestroy) destroy;
  decltype(&::cudnnSetStream) set_stream;
  decltype(&::cudnnCreateTensorDescriptor) create_tensor;
  decltype(&::cudnnSetTensor4dDescriptor) set_tensor;
  decltype(&::cudnnDestroyTensorDescriptor) destroy_tensor;
  decltype(&::cudnnCreateFilterDescriptor) create_filter;
  decltype(&::cudnnSetFilter4dDescriptor) set_filter;
  decltype(&::cudnnDestroyFilterDescriptor) destroy_filter;
  decltype(&::cudnnCreateConvolutionDescriptor) create_convolution;
  decltype(&::cudnnSetConvolution2dDescriptor) set_convolution;
  decltype(&::cudnnSetConvolutionMathType) set_math_type;
  decltype(&::cudnnGetConvolution2dForwardOutputDim) forward_output_dim;
  decltype(&::cudnnDestroyConvolutionDescriptor) destroy_convolution;
  decltype(&::cudnnGetConvolutionForwardAlgorithm_v7) forward_algorithms;
  decltype(&::cudnnGetConvolutionForwardWorkspaceSize) forward_workspace;
  decltype(&::cudnnConvolutionForward) forward;
  decltype(&::cudnnGetConvolutionBackwardDataAlgorithm_v7) backward_data_algorithms;
  decltype(&::cudnnGetConvolutionBackwardDataWorkspaceSize) backward_data_workspace;
  decltype(&::cudnnConvolutionBackwardData) backward_data;
  decltype(&::cudnnGetConvolutionBackwardFilterAlgorithm_v7) backward_filter_algorithms;
  decltype(&::cudnnGetConvolutionBackwardFilterWorkspaceSize) backward_filter_workspace;
  decltype(&::cudnnConvolutionBackwardFilter) backward_filter;

  /// Opens libcudnn.so.<major> (this build's major) once; nullptr when it
  /// cannot be opened, lacks a function or is of another major version
  /// (unavailable_reason() says which).
  static const cudnn_library* get();
  /// "" when get() has the library, else why not.
  static const std::string& unavailable_reason();
  /// Whether this process has loaded cuDNN (by get() or otherwise).
  static bool loaded();
};

/// Throws cuda_error naming a failed cuDNN call and cudnnGetErrorString.
void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line);
#define TROUPE_CUDNN_CHECK(call) ::troupe::detail::cuda::check_cudnn((call), #call, __FILE__, __LINE__)

} // namespace troupe::detail::cuda
