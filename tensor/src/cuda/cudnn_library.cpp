#include "cudnn_library.hpp"

#include <dlfcn.h>

#include <fmt/format.h>

#include "library_loading.hpp"
#include "troupe/tensor/cuda.hpp"

#define TROUPE_CUDNN_TEXT(x) #x
#define TROUPE_CUDNN_MAJOR_TEXT(x) TROUPE_CUDNN_TEXT(x)

namespace troupe::detail::cuda {

namespace {

/// The soname this build compiled against (found on LD_LIBRARY_PATH, as a
/// GPU machine's own cuDNN is), then the file CMake found.
const char* const candidates[] = {"libcudnn.so." TROUPE_CUDNN_MAJOR_TEXT(CUDNN_MAJOR), TROUPE_CUDNN_LIBRARY_PATH};

struct opened {
  cudnn_library lib{};
  bool usable = false;
  std::string why_not;
};

opened open_cudnn() {
  opened result;
  std::string why;
  void* handle = open_first_library({candidates[0], candidates[1]}, why);
  if (handle == nullptr) {
    result.why_not = fmt::format("cannot load cuDNN: {}", why);
    return result;
  }
  std::string missing;
  auto symbol = [&](const char* name) {
    void* found = ::dlsym(handle, name);
    if (found == nullptr)
      missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
    return found;
  };
  auto& lib = result.lib;
#define TROUPE_CUDNN_BIND(member, function) lib.member = reinterpret_cast<decltype(lib.member)>(symbol(#function))
  TROUPE_CUDNN_BIND(get_version, cudnnGetVersion);
  TROUPE_CUDNN_BIND(error_string, cudnnGetErrorString);
  TROUPE_CUDNN_BIND(create, cudnnCreate);
  TROUPE_CUDNN_BIND(destroy, cudnnDestroy);
  TROUPE_CUDNN_BIND(set_stream, cudnnSetStream);
  TROUPE_CUDNN_BIND(create_tensor, cudnnCreateTensorDescriptor);
  TROUPE_CUDNN_BIND(set_tensor, cudnnSetTensor4dDescriptor);
  TROUPE_CUDNN_BIND(destroy_tensor, cudnnDestroyTensorDescriptor);
  TROUPE_CUDNN_BIND(create_filter, cudnnCreateFilterDescriptor);
  TROUPE_CUDNN_BIND(set_filter, cudnnSetFilter4dDescriptor);
  TROUPE_CUDNN_BIND(destroy_filter, cudnnDestroyFilterDescriptor);
  TROUPE_CUDNN_BIND(create_convolution, cudnnCreateConvolutionDescriptor);
  TROUPE_CUDNN_BIND(set_convolution, cudnnSetConvolution2dDescriptor);
  TROUPE_CUDNN_BIND(set_math_type, cudnnSetConvolutionMathType);
  TROUPE_CUDNN_BIND(forward_output_dim, cudnnGetConvolution2dForwardOutputDim);
  TROUPE_CUDNN_BIND(destroy_convolution, cudnnDestroyConvolutionDescriptor);
  TROUPE_CUDNN_BIND(forward_algorithms, cudnnGetConvolutionForwardAlgorithm_v7);
  TROUPE_CUDNN_BIND(forward_workspace, cudnnGetConvolutionForwardWorkspaceSize);
  TROUPE_CUDNN_BIND(forward, cudnnConvolutionForward);
  TROUPE_CUDNN_BIND(backward_data_algorithms, cudnnGetConvolutionBackwardDataAlgorithm_v7);
  TROUPE_CUDNN_BIND(backward_data_workspace, cudnnGetConvolutionBackwardDataWorkspaceSize);
  TROUPE_CUDNN_BIND(backward_data, cudnnConvolutionBackwardData);
  TROUPE_CUDNN_BIND(backward_filter_algorithms, cudnnGetConvolutionBackwardFilterAlgorithm_v7);
  TROUPE_CUDNN_BIND(backward_filter_workspace, cudnnGetConvolutionBackwardFilterWorkspaceSize);
  TROUPE_CUDNN_BIND(backward_filter, cudnnConvolutionBackwardFilter);
#undef TROUPE_CUDNN_BIND
  if (!missing.empty()) {
    result.why_not = fmt::format("cuDNN ({}) has no function {}", candidates[0], missing);
    return result;
  }
  // cuDNN keeps its API within a major version (version = major * 10000 +
  // minor * 100 + patch since cuDNN 9).
  const auto version = lib.get_version();
  if (version / 10000 != CUDNN_MAJOR) {
    result.why_not = fmt::format("cuDNN {} was loaded but troupe was built against cuDNN {}", version, CUDNN_VERSION);
    return result;
  }
  result.usable = true;
  return result;
}

const opened& the_library() {
  static const opened once = open_cudnn();
  return once;
}

} // namespace

const cudnn_library* cudnn_library::get() {
  const auto& once = the_library();
  return once.usable ? &once.lib : nullptr;
}

const std::string& cudnn_library::unavailable_reason() {
  return the_library().why_not;
}

bool cudnn_library::loaded() {
  return library_loaded(candidates[0]);
}

void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS)
    return;
  const auto* lib = cudnn_library::get();
  throw cuda_error(fmt::format("{} failed: {} ({}:{})", call,
                               lib != nullptr ? lib->error_string(status) : "cuDNN error", file, line));
}

} // namespace troupe::detail::cuda
