// The stand-in cuDNN (cudnn.h): cuDNN's legacy convolution functions on
// the stand-in runtime, so that CI runs the CUDA backend's cuDNN path
// (tensor/src/cuda/cudnn_convolution.cpp) without a GPU. The arithmetic is
// a plain direct convolution; what this checks is the calls around it.
//
// It holds the backend to what cuDNN's documentation asks, where a mistake
// would otherwise go unseen on the host:
// - a handle belongs to the device current at cudnnCreate; its stream must
//   be of that device, and its work is queued only while that device is
//   current (else CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH or
//   CUDNN_STATUS_EXECUTION_FAILED_CUDART);
// - descriptors agree: one data type (the convolution's compute type
//   too), the filter's channels the input's, the output the shape
//   cudnnGetConvolution2dForwardOutputDim gives; each buffer lies in memory
//   of the handle's device and spans what its descriptor says;
// - the workspace is at least what the size query said for the algorithm,
//   and its bytes are the scratch the pass computes in, so a workspace
//   freed or reused before the queued pass runs spoils the result;
// - output = alpha * op(inputs) + beta * output, the output not read where
//   beta is 0 (alpha and beta of the compute type, read at the call).
// Its heuristics rank first what the backend must refuse: an algorithm
// cuDNN cannot run for the shape, one using tensor-core (TF32) math, and
// non-deterministic ones. Run anyway, the TF32 one rounds its inputs to
// TF32 and the non-deterministic ones sum in an order that changes with
// every call, as on a GPU.
// Work is queued on the handle's stream like a kernel, and runs when the
// stream does (cuda_runtime_api.h).
#include "cudnn.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

struct cudnnContext {
  int device = 0; // current at cudnnCreate
  cudaStream_t stream = nullptr;
};

struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
};

struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, h = 0, w = 0;
};

struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace {

enum class pass { forward, backward_data, backward_filter };

/// One convolution, checked: the input [n, c, h, w], the filter [k, c, kh,
/// kw], the output [n, k, oh, ow].
struct geometry {
  cudnnDataType_t type;
  int n, c, h, w, k, kh, kw, oh, ow;
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  bool flipped; // CUDNN_CONVOLUTION: the filter is applied reversed

  std::size_t element() const { return type == CUDNN_DATA_DOUBLE ? sizeof(double) : sizeof(float); }
  std::size_t input_bytes() const { return std::size_t(n) * c * h * w * element(); }
  std::size_t filter_bytes() const { return std::size_t(k) * c * kh * kw * element(); }
  std::size_t output_bytes() const { return std::size_t(n) * k * oh * ow * element(); }
};

/// One output dimension, as cuDNN's documentation gives it; 0 where the
/// filter does not fit.
int output_size(int input, int pad, int filter, int dilation, int stride) {
  const int reach = input + 2 * pad - ((filter - 1) * dilation + 1);
  return reach < 0 ? 0 : 1 + reach / stride;
}

/// The convolution of x, w and conv, and its output checked against y
/// where y is given.
cudnnStatus_t describe(const cudnnTensorStruct* x, const cudnnFilterStruct* w, const cudnnConvolutionStruct* conv,
                       const cudnnTensorStruct* y, geometry& g) {
  if (x == nullptr || w == nullptr || conv == nullptr || !x->set || !w->set || !conv->set || (y != nullptr && !y->set))
    return CUDNN_STATUS_BAD_PARAM;
  if (w->type != x->type || conv->compute != x->type || (y != nullptr && y->type != x->type))
    return CUDNN_STATUS_BAD_PARAM;
  if (w->c != x->c)
    return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
  g = geometry{x->type,
               x->n,
               x->c,
               x->h,
               x->w,
               w->k,
               w->h,
               w->w,
               output_size(x->h, conv->pad_h, w->h, conv->dilation_h, conv->stride_h),
               output_size(x->w, conv->pad_w, w->w, conv->dilation_w, conv->stride_w),
               conv->pad_h,
               conv->pad_w,
               conv->stride_h,
               conv->stride_w,
               conv->dilation_h,
               conv->dilation_w,
               conv->mode == CUDNN_CONVOLUTION};
  if (g.oh <= 0 || g.ow <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  if (y != nullptr && (y->n != g.n || y->c != g.k || y->h != g.oh || y->w != g.ow))
    return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
  return CUDNN_STATUS_SUCCESS;
}

/// What the stand-in's heuristics say of an algorithm of a pass.
struct algorithm {
  int id;
  cudnnStatus_t status;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
  bool needs_workspace; // the pass's output, computed there first
};

/// Ranked as the stand-in's heuristics rank them: first what the backend
/// must not take.
const std::vector<algorithm>& ranking(pass which) {
  static const std::vector<algorithm> forward{
    {CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, CUDNN_STATUS_NOT_SUPPORTED, CUDNN_DETERMINISTIC, CUDNN_FMA_MATH, false},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC, CUDNN_TENSOR_OP_MATH, false},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC, CUDNN_FMA_MATH,
     true},
  };
  static const std::vector<algorithm> backward_data{
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, CUDNN_STATUS_SUCCESS, CUDNN_NON_DETERMINISTIC, CUDNN_FMA_MATH, false},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC, CUDNN_FMA_MATH, true},
  };
  static const std::vector<algorithm> backward_filter{
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, CUDNN_STATUS_SUCCESS, CUDNN_NON_DETERMINISTIC, CUDNN_FMA_MATH, false},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, CUDNN_STATUS_SUCCESS, CUDNN_NON_DETERMINISTIC, CUDNN_FMA_MATH, false},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_STATUS_SUCCESS, CUDNN_DETERMINISTIC, CUDNN_FMA_MATH, true},
  };
  switch (which) {
  case pass::forward:
    return forward;
  case pass::backward_data:
    return backward_data;
  case pass::backward_filter:
    return backward_filter;
  }
  return forward;
}

const algorithm* find_algorithm(pass which, int id) {
  for (const auto& a : ranking(which))
    if (a.id == id)
      return &a;
  return nullptr;
}

template <class Perf>
cudnnStatus_t rank(pass which, const cudnnContext* handle, int requested, int* returned, Perf* results) {
  if (handle == nullptr || returned == nullptr || results == nullptr || requested < 1)
    return CUDNN_STATUS_BAD_PARAM;
  const auto& ranked = ranking(which);
  int count = 0;
  for (const auto& a : ranked) {
    if (count == requested)
      break;
    Perf p{};
    p.algo = static_cast<decltype(p.algo)>(a.id);
    p.status = a.status;
    p.time = -1.0f; // heuristics time nothing
    p.determinism = a.determinism;
    p.mathType = a.math;
    results[count++] = p;
  }
  *returned = count;
  return CUDNN_STATUS_SUCCESS;
}

/// The bytes of the pass's output: its workspace, where it needs one.
std::size_t output_of(pass which, const geometry& g) {
  switch (which) {
  case pass::forward:
    return g.output_bytes();
  case pass::backward_data:
    return g.input_bytes();
  case pass::backward_filter:
    return g.filter_bytes();
  }
  return 0;
}

cudnnStatus_t workspace_size(pass which, const cudnnContext* handle, const geometry& g, int id, std::size_t* bytes) {
  const auto* a = find_algorithm(which, id);
  if (handle == nullptr || bytes == nullptr || a == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  if (a->status != CUDNN_STATUS_SUCCESS)
    return a->status;
  *bytes = a->needs_workspace ? output_of(which, g) : 0;
  return CUDNN_STATUS_SUCCESS;
}

/// A float rounded to TF32 (10 bits of mantissa, to nearest even), as
/// tensor cores read float32 operands.
float tf32(float value) {
  auto bits = std::bit_cast<std::uint32_t>(value);
  bits += 0xfffu + ((bits >> 13) & 1u);
  return std::bit_cast<float>(bits & ~0x1fffu);
}

std::atomic<std::uint32_t> calls{0}; // turns the order of non-deterministic sums

/// The pass, computed into `result` (the output's shape), reading `a` and
/// `b`: forward x and w, backward data dy and w, backward filter x and dy.
template <class T>
void compute(pass which, const geometry& g, const algorithm& how, std::uint32_t call, const T* a, const T* b,
             T* result) {
  const bool rounded = how.math == CUDNN_TENSOR_OP_MATH;
  auto operand = [rounded](T v) {
    if constexpr (sizeof(T) == sizeof(float))
      return rounded ? tf32(v) : v;
    else
      return v;
  };
  auto input_at = [&g](int n, int c, int y, int x) { return ((std::size_t(n) * g.c + c) * g.h + y) * g.w + x; };
  auto output_at = [&g](int n, int k, int y, int x) { return ((std::size_t(n) * g.k + k) * g.oh + y) * g.ow + x; };
  auto filter_at = [&g](int k, int c, int r, int s) {
    if (g.flipped) {
      r = g.kh - 1 - r;
      s = g.kw - 1 - s;
    }
    return ((std::size_t(k) * g.c + c) * g.kh + r) * g.kw + s;
  };
  const std::size_t count = output_of(which, g) / sizeof(T);
  std::fill(result, result + count, T(0));
  // Non-deterministic: the batch summed from another start on every call.
  const int first = how.determinism == CUDNN_NON_DETERMINISTIC ? static_cast<int>(call % std::uint32_t(g.n)) : 0;
  for (int step = 0; step < g.n; ++step) {
    const int n = (first + step) % g.n;
    for (int k = 0; k < g.k; ++k)
      for (int oy = 0; oy < g.oh; ++oy)
        for (int ox = 0; ox < g.ow; ++ox)
          for (int c = 0; c < g.c; ++c)
            for (int r = 0; r < g.kh; ++r) {
              const int iy = oy * g.stride_h - g.pad_h + r * g.dilation_h;
              if (iy < 0 || iy >= g.h)
                continue;
              for (int s = 0; s < g.kw; ++s) {
                const int ix = ox * g.stride_w - g.pad_w + s * g.dilation_w;
                if (ix < 0 || ix >= g.w)
                  continue;
                switch (which) {
                case pass::forward:
                  result[output_at(n, k, oy, ox)] += operand(a[input_at(n, c, iy, ix)]) * operand(b[filter_at(k, c, r, s)]);
                  break;
                case pass::backward_data:
                  result[input_at(n, c, iy, ix)] += a[output_at(n, k, oy, ox)] * b[filter_at(k, c, r, s)];
                  break;
                case pass::backward_filter:
                  result[filter_at(k, c, r, s)] += a[input_at(n, c, iy, ix)] * b[output_at(n, k, oy, ox)];
                  break;
                }
              }
            }
  }
}

/// output = alpha * result + beta * output; output not read where beta is 0.
template <class T> void blend(T alpha, T beta, const T* result, T* output, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    output[i] = alpha * result[i] + (beta == T(0) ? T(0) : beta * output[i]);
}

/// Checks a pass's call and queues it on the handle's stream.
cudnnStatus_t run(pass which, cudnnContext* handle, const geometry& g, int id, const void* alpha, const void* a,
                  std::size_t a_bytes, const void* b, std::size_t b_bytes, void* workspace,
                  std::size_t workspace_bytes, const void* beta, void* output) {
  const auto* how = find_algorithm(which, id);
  if (handle == nullptr || how == nullptr || alpha == nullptr || beta == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  if (how->status != CUDNN_STATUS_SUCCESS)
    return how->status;
  const std::size_t needed = how->needs_workspace ? output_of(which, g) : 0;
  if (workspace_bytes < needed)
    return CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT;
  cudaStream_t stream = handle->stream;
  // Queued only on a stream of the handle's device, that device current.
  if (!cuda_on_host::may_launch_on(stream) || cuda_on_host::device_of(stream) != handle->device)
    return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
  using cuda_on_host::device_memory_holds;
  if (!device_memory_holds(handle->device, a, a_bytes) || !device_memory_holds(handle->device, b, b_bytes) ||
      !device_memory_holds(handle->device, output, output_of(which, g)) ||
      (needed > 0 && !device_memory_holds(handle->device, workspace, needed)))
    return CUDNN_STATUS_EXECUTION_FAILED;
  const std::uint32_t call = calls.fetch_add(1);
  const std::size_t count = output_of(which, g) / g.element();
  auto queue = [&](auto scale, auto keep) {
    using T = decltype(scale);
    const auto* in_a = static_cast<const T*>(a);
    const auto* in_b = static_cast<const T*>(b);
    auto* out = static_cast<T*>(output);
    auto* scratch = needed > 0 ? static_cast<T*>(workspace) : nullptr;
    const algorithm chosen = *how;
    cuda_on_host::enqueue(stream, [=] {
      std::vector<T> own;
      T* result = scratch;
      if (result == nullptr) {
        own.resize(count);
        result = own.data();
      }
      compute(which, g, chosen, call, in_a, in_b, result);
      blend(scale, keep, result, out, count);
    });
  };
  cuda_on_host::count_library_pass();
  if (g.type == CUDNN_DATA_DOUBLE)
    queue(*static_cast<const double*>(alpha), *static_cast<const double*>(beta));
  else
    queue(*static_cast<const float*>(alpha), *static_cast<const float*>(beta));
  return CUDNN_STATUS_SUCCESS;
}

bool supported(cudnnDataType_t type) {
  return type == CUDNN_DATA_FLOAT || type == CUDNN_DATA_DOUBLE;
}

} // namespace

extern "C" {

std::size_t cudnnGetVersion() {
  return 90000;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
  case CUDNN_STATUS_SUCCESS:
    return "CUDNN_STATUS_SUCCESS";
  case CUDNN_STATUS_NOT_INITIALIZED:
    return "CUDNN_STATUS_NOT_INITIALIZED";
  case CUDNN_STATUS_BAD_PARAM:
    return "CUDNN_STATUS_BAD_PARAM";
  case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
    return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
  case CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT:
    return "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT";
  case CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH:
    return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
  case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
    return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
  case CUDNN_STATUS_NOT_SUPPORTED:
    return "CUDNN_STATUS_NOT_SUPPORTED";
  case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE:
    return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
  case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT:
    return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
  case CUDNN_STATUS_EXECUTION_FAILED:
    return "CUDNN_STATUS_EXECUTION_FAILED";
  case CUDNN_STATUS_EXECUTION_FAILED_CUDART:
    return "CUDNN_STATUS_EXECUTION_FAILED_CUDART";
  }
  return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return CUDNN_STATUS_NOT_INITIALIZED;
  *handle = new cudnnContext{device, nullptr};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  if (cuda_on_host::device_of(stream) != handle->device)
    return CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* descriptor) {
  if (descriptor == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  *descriptor = new cudnnTensorStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t descriptor, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
  if (descriptor == nullptr || n <= 0 || c <= 0 || h <= 0 || w <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW)
    return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT; // the stand-in's only layout
  if (!supported(type))
    return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
  *descriptor = cudnnTensorStruct{true, type, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t descriptor) {
  delete descriptor;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* descriptor) {
  if (descriptor == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  *descriptor = new cudnnFilterStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t descriptor, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  if (descriptor == nullptr || k <= 0 || c <= 0 || h <= 0 || w <= 0)
    return CUDNN_STATUS_BAD_PARAM;
  if (format != CUDNN_TENSOR_NCHW)
    return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
  if (!supported(type))
    return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
  *descriptor = cudnnFilterStruct{true, type, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t descriptor) {
  delete descriptor;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* descriptor) {
  if (descriptor == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  *descriptor = new cudnnConvolutionStruct;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t descriptor, int pad_h, int pad_w, int u,
                                              int v, int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type) {
  if (descriptor == nullptr || pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0 ||
      (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION))
    return CUDNN_STATUS_BAD_PARAM;
  if (!supported(compute_type))
    return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
  const auto math = descriptor->math;
  *descriptor = cudnnConvolutionStruct{true, pad_h, pad_w, u, v, dilation_h, dilation_w, mode, compute_type, math};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t descriptor, cudnnMathType_t math) {
  if (descriptor == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  descriptor->math = math;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convolution,
                                                    const cudnnTensorDescriptor_t input,
                                                    const cudnnFilterDescriptor_t filter, int* n, int* c, int* h,
                                                    int* w) {
  geometry g{};
  if (n == nullptr || c == nullptr || h == nullptr || w == nullptr)
    return CUDNN_STATUS_BAD_PARAM;
  if (auto status = describe(input, filter, convolution, nullptr, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  *n = g.n;
  *c = g.k;
  *h = g.oh;
  *w = g.ow;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t descriptor) {
  delete descriptor;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t convolution,
                                                     const cudnnTensorDescriptor_t y, const int requested,
                                                     int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
  geometry g{};
  if (auto status = describe(x, w, convolution, y, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return rank(pass::forward, handle, requested, returned, results);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t convolution,
                                                      const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
                                                      std::size_t* bytes) {
  geometry g{};
  if (auto status = describe(x, w, convolution, y, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return workspace_size(pass::forward, handle, g, algo, bytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t x_desc,
                                      const void* x, const cudnnFilterDescriptor_t w_desc, const void* w,
                                      const cudnnConvolutionDescriptor_t convolution, cudnnConvolutionFwdAlgo_t algo,
                                      void* workspace, std::size_t workspace_bytes, const void* beta,
                                      const cudnnTensorDescriptor_t y_desc, void* y) {
  geometry g{};
  if (auto status = describe(x_desc, w_desc, convolution, y_desc, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return run(pass::forward, handle, g, algo, alpha, x, g.input_bytes(), w, g.filter_bytes(), workspace,
             workspace_bytes, beta, y);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t convolution,
                                                          const cudnnTensorDescriptor_t dx, const int requested,
                                                          int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results) {
  geometry g{};
  if (auto status = describe(dx, w, convolution, dy, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return rank(pass::backward_data, handle, requested, returned, results);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t w,
                                                           const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t convolution,
                                                           const cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo, std::size_t* bytes) {
  geometry g{};
  if (auto status = describe(dx, w, convolution, dy, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return workspace_size(pass::backward_data, handle, g, algo, bytes);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t w_desc,
                                           const void* w, const cudnnTensorDescriptor_t dy_desc, const void* dy,
                                           const cudnnConvolutionDescriptor_t convolution,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workspace,
                                           std::size_t workspace_bytes, const void* beta,
                                           const cudnnTensorDescriptor_t dx_desc, void* dx) {
  geometry g{};
  if (auto status = describe(dx_desc, w_desc, convolution, dy_desc, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return run(pass::backward_data, handle, g, algo, alpha, dy, g.output_bytes(), w, g.filter_bytes(), workspace,
             workspace_bytes, beta, dx);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                            const cudnnTensorDescriptor_t dy,
                                                            const cudnnConvolutionDescriptor_t convolution,
                                                            const cudnnFilterDescriptor_t dw, const int requested,
                                                            int* returned,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* results) {
  geometry g{};
  if (auto status = describe(x, dw, convolution, dy, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return rank(pass::backward_filter, handle, requested, returned, results);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                             const cudnnTensorDescriptor_t dy,
                                                             const cudnnConvolutionDescriptor_t convolution,
                                                             const cudnnFilterDescriptor_t dw,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, std::size_t* bytes) {
  geometry g{};
  if (auto status = describe(x, dw, convolution, dy, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return workspace_size(pass::backward_filter, handle, g, algo, bytes);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t x_desc, const void* x,
                                             const cudnnTensorDescriptor_t dy_desc, const void* dy,
                                             const cudnnConvolutionDescriptor_t convolution,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workspace,
                                             std::size_t workspace_bytes, const void* beta,
                                             const cudnnFilterDescriptor_t dw_desc, void* dw) {
  geometry g{};
  if (auto status = describe(x_desc, dw_desc, convolution, dy_desc, g); status != CUDNN_STATUS_SUCCESS)
    return status;
  return run(pass::backward_filter, handle, g, algo, alpha, x, g.input_bytes(), dy, g.output_bytes(), workspace,
             workspace_bytes, beta, dw);
}

} // extern "C"
