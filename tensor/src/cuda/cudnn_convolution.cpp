// conv2d through cuDNN (cudnn_convolution.hpp).
//
// Which algorithm. cuDNN's heuristics (the _v7 queries, which time
// nothing) rank the algorithms for a shape; the first that is
// deterministic and uses no TF32 is taken, once per shape, pass and device.
// Deterministic, because distributed training is checked against one
// process step by step, and a backward pass that sums with atomics in a
// new order each run would make two identical runs differ. No TF32,
// because a float32 convolution is to equal the CPU's within float32
// rounding (the benchmarks run PyTorch with TF32 off too). Where no
// algorithm qualifies, or cuDNN refuses to run the one taken, the shape is
// remembered and troupe's own kernels run it.
#include "cudnn_convolution.hpp"

#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "cuda_context.hpp"
#include "cudnn_library.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::detail::cuda {

namespace {

bool turned_off() {
  static const bool off = [] {
    const char* choice = std::getenv("TROUPE_CUDNN");
    return choice != nullptr && (std::string_view(choice) == "off" || std::string_view(choice) == "0");
  }();
  return off;
}

/// The library when convolutions are to use it, else nullptr.
const cudnn_library* wanted() {
  return turned_off() ? nullptr : cudnn_library::get();
}

enum class pass { forward, backward_data, backward_filter };

const char* name_of(pass which) {
  switch (which) {
  case pass::forward:
    return "forward";
  case pass::backward_data:
    return "input gradient";
  case pass::backward_filter:
    return "weight gradient";
  }
  return "?";
}

/// One convolution as cuDNN sees it: n, c, h, w, outputs, kh, kw, stride,
/// padding.
using conv_sizes = std::array<int, 9>;

/// The sizes of a convolution, or false when one exceeds cuDNN's int (or a
/// tensor its 2^31 elements).
bool sizes_of(const tensor& input, const tensor& weight, const conv_geometry& g, conv_sizes& sizes) {
  const std::array<std::int64_t, 9> wide{input.size(0), g.channels,  g.height, g.width,  weight.size(0),
                                         g.kernel_h,    g.kernel_w,  g.stride, g.padding};
  for (std::size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] > INT_MAX)
      return false;
    sizes[i] = static_cast<int>(wide[i]);
  }
  const auto out_numel = input.size(0) * weight.size(0) * g.out_h * g.out_w;
  return input.numel() < INT_MAX && weight.numel() < INT_MAX && out_numel < INT_MAX && input.numel() > 0 &&
         out_numel > 0;
}

bool data_type_of(dtype type, cudnnDataType_t& data) {
  if (type == dtype::float32)
    data = CUDNN_DATA_FLOAT;
  else if (type == dtype::float64)
    data = CUDNN_DATA_DOUBLE;
  else
    return false;
  return true;
}

/// The descriptors of one convolution, owned.
class descriptors {
public:
  descriptors(const cudnn_library& lib, cudnnDataType_t type, const conv_sizes& s, const conv_geometry& g)
      : lib_(lib) {
    try {
      describe(type, s, g);
    } catch (...) {
      release();
      throw;
    }
  }
  ~descriptors() { release(); }
  descriptors(const descriptors&) = delete;
  descriptors& operator=(const descriptors&) = delete;

  cudnnTensorDescriptor_t input = nullptr;
  cudnnTensorDescriptor_t output = nullptr;
  cudnnFilterDescriptor_t weight = nullptr;
  cudnnConvolutionDescriptor_t convolution = nullptr;

private:
  void describe(cudnnDataType_t type, const conv_sizes& s, const conv_geometry& g) {
    const auto& lib = lib_;
    const auto [n, c, h, w, outputs, kh, kw, stride, padding] = s;
    TROUPE_CUDNN_CHECK(lib.create_tensor(&input));
    TROUPE_CUDNN_CHECK(lib.create_tensor(&output));
    TROUPE_CUDNN_CHECK(lib.create_filter(&weight));
    TROUPE_CUDNN_CHECK(lib.create_convolution(&convolution));
    TROUPE_CUDNN_CHECK(lib.set_tensor(input, CUDNN_TENSOR_NCHW, type, n, c, h, w));
    TROUPE_CUDNN_CHECK(lib.set_tensor(output, CUDNN_TENSOR_NCHW, type, n, outputs, static_cast<int>(g.out_h),
                                      static_cast<int>(g.out_w)));
    TROUPE_CUDNN_CHECK(lib.set_filter(weight, type, CUDNN_TENSOR_NCHW, outputs, c, kh, kw));
    // Cross-correlation, as conv2d is everywhere in troupe (and PyTorch);
    // accumulation in the data's own precision.
    TROUPE_CUDNN_CHECK(lib.set_convolution(convolution, padding, padding, stride, stride, 1, 1,
                                           CUDNN_CROSS_CORRELATION, type));
    TROUPE_CUDNN_CHECK(lib.set_math_type(convolution, CUDNN_FMA_MATH));
  }

  /// Destroys what was made: destroying a descriptor only frees host
  /// memory, and a failure is ignored.
  void release() {
    if (convolution != nullptr)
      lib_.destroy_convolution(convolution);
    if (weight != nullptr)
      lib_.destroy_filter(weight);
    if (output != nullptr)
      lib_.destroy_tensor(output);
    if (input != nullptr)
      lib_.destroy_tensor(input);
  }

  const cudnn_library& lib_;
};

/// The output shape cuDNN computes from the descriptors.
std::array<int, 4> output_dims(const cudnn_library& lib, const descriptors& d) {
  std::array<int, 4> dims{};
  TROUPE_CUDNN_CHECK(lib.forward_output_dim(d.convolution, d.input, d.weight, &dims[0], &dims[1], &dims[2], &dims[3]));
  return dims;
}

/// troupe's output shape of a convolution cuDNN takes (sizes_of checked
/// that it fits an int).
std::array<int, 4> troupe_output_dims(const conv_sizes& s, const conv_geometry& g) {
  return {s[0], s[4], static_cast<int>(g.out_h), static_cast<int>(g.out_w)};
}

/// Set when cuDNN could not make a handle on a device (a library built
/// for another CUDA, a device it does not support): convolutions run on
/// troupe's kernels from then on, everywhere in the process.
std::atomic<bool> handles_failed{false};

/// The cuDNN handle of `queue`'s stream, made on its first use; nullptr
/// (said once on stderr) when cuDNN cannot make one.
cudnnHandle_t handle_of(execution_stream& queue, const cudnn_library& lib) {
  if (!queue.dnn) {
    if (handles_failed.load(std::memory_order_relaxed))
      return nullptr;
    cudnnHandle_t handle = nullptr;
    auto status = lib.create(&handle);
    if (status == CUDNN_STATUS_SUCCESS) {
      // Owned before anything else can fail.
      queue.dnn = std::shared_ptr<void>(handle, [&lib](void* h) { lib.destroy(static_cast<cudnnHandle_t>(h)); });
      status = lib.set_stream(handle, queue.stream.get());
      if (status != CUDNN_STATUS_SUCCESS)
        queue.dnn.reset();
    }
    if (status != CUDNN_STATUS_SUCCESS) {
      if (!handles_failed.exchange(true))
        std::fprintf(stderr, "troupe: cuDNN cannot run here (%s); troupe's own kernels run every convolution\n",
                     lib.error_string(status));
      return nullptr;
    }
  }
  return static_cast<cudnnHandle_t>(queue.dnn.get());
}

struct algorithm_key {
  int device;
  cudnnDataType_t type;
  conv_sizes sizes;
  pass which;

  auto tie() const { return std::tie(device, type, sizes, which); }
  bool operator<(const algorithm_key& other) const { return tie() < other.tie(); }
};

/// An algorithm of the pass's enum, or -1: troupe's kernels run the shape.
class algorithm_choices {
public:
  template <class Choose> int get(const algorithm_key& key, Choose choose) {
    {
      std::lock_guard lock(mutex_);
      if (auto found = chosen_.find(key); found != chosen_.end())
        return found->second;
    }
    const int algorithm = choose(); // outside the lock: a query may take a while
    std::lock_guard lock(mutex_);
    chosen_.emplace(key, algorithm);
    return algorithm;
  }

  /// cuDNN refused to run `key`'s algorithm: its own kernels from now on.
  void decline(const algorithm_key& key) {
    std::lock_guard lock(mutex_);
    chosen_[key] = -1;
  }

private:
  std::mutex mutex_;
  std::map<algorithm_key, int> chosen_;
};

algorithm_choices& choices() {
  static auto* instance = new algorithm_choices; // leaked: used by tensors freed after main
  return *instance;
}

void say_declined(const algorithm_key& key, std::string_view why) {
  const auto& s = key.sizes;
  std::fprintf(stderr,
               "troupe: cuDNN does not run the %s of conv2d input [%d, %d, %d, %d] weight [%d, %d, %d, %d] stride %d "
               "padding %d (%s, %.*s); troupe's own kernels run it\n",
               name_of(key.which), s[0], s[1], s[2], s[3], s[4], s[1], s[5], s[6], s[7], s[8],
               key.type == CUDNN_DATA_FLOAT ? "float32" : "float64", static_cast<int>(why.size()), why.data());
}

/// The first of cuDNN's ranked algorithms that ran its query successfully,
/// is deterministic and uses no tensor-core (TF32) math; -1 when none is.
template <class Perf> int first_qualifying(const Perf* ranked, int count) {
  for (int i = 0; i < count; ++i) {
    const auto& p = ranked[i];
    if (p.status == CUDNN_STATUS_SUCCESS && p.determinism == CUDNN_DETERMINISTIC &&
        (p.mathType == CUDNN_FMA_MATH || p.mathType == CUDNN_DEFAULT_MATH))
      return static_cast<int>(p.algo);
  }
  return -1;
}

int choose(const cudnn_library& lib, cudnnHandle_t handle, const descriptors& d, pass which) {
  int count = 0;
  switch (which) {
  case pass::forward: {
    std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> ranked{};
    TROUPE_CUDNN_CHECK(lib.forward_algorithms(handle, d.input, d.weight, d.convolution, d.output,
                                              static_cast<int>(ranked.size()), &count, ranked.data()));
    return first_qualifying(ranked.data(), count);
  }
  case pass::backward_data: {
    std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> ranked{};
    TROUPE_CUDNN_CHECK(lib.backward_data_algorithms(handle, d.weight, d.output, d.convolution, d.input,
                                                    static_cast<int>(ranked.size()), &count, ranked.data()));
    return first_qualifying(ranked.data(), count);
  }
  case pass::backward_filter: {
    std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> ranked{};
    TROUPE_CUDNN_CHECK(lib.backward_filter_algorithms(handle, d.input, d.output, d.convolution, d.weight,
                                                      static_cast<int>(ranked.size()), &count, ranked.data()));
    return first_qualifying(ranked.data(), count);
  }
  }
  return -1;
}

/// cuDNN 9's status codes: the category in the thousands, the detail below.
bool not_supported(cudnnStatus_t status) {
  return static_cast<int>(status) / 1000 * 1000 == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED);
}

/// Everything one pass needs: the library, handle, descriptors and the
/// scaling factors in the type cuDNN reads for the data's type.
struct call {
  const cudnn_library& lib;
  cudnnHandle_t handle;
  const descriptors& d;
  algorithm_key key;
  std::array<int, 4> output; ///< troupe's output shape
  double alpha64 = 1.0, beta64 = 0.0;
  float alpha32 = 1.0f, beta32 = 0.0f;

  const void* alpha() const { return key.type == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&alpha64) : &alpha32; }
  const void* beta() const { return key.type == CUDNN_DATA_DOUBLE ? static_cast<const void*>(&beta64) : &beta32; }
};

/// The algorithm of c's pass and shape, chosen on first use: none where
/// cuDNN reads the descriptors as another output shape than troupe's.
int algorithm_for(const call& c) {
  return choices().get(c.key, [&] {
    if (const auto dims = output_dims(c.lib, c.d); dims != c.output) {
      say_declined(c.key, fmt::format("cuDNN's output shape [{}] is not troupe's [{}]", fmt::join(dims, ", "),
                                      fmt::join(c.output, ", ")));
      return -1;
    }
    const int chosen = choose(c.lib, c.handle, c.d, c.key.which);
    if (chosen < 0)
      say_declined(c.key, "no deterministic algorithm without TF32");
    return chosen;
  });
}

/// Runs one pass with its chosen algorithm; false when troupe's kernels
/// are to run it instead.
template <class Run, class WorkspaceSize>
bool run_pass(const call& c, const tensor& like, WorkspaceSize workspace_size, Run run) {
  const int algorithm = algorithm_for(c);
  if (algorithm < 0)
    return false;
  std::size_t bytes = 0;
  auto status = workspace_size(algorithm, bytes);
  tensor workspace;
  if (status == CUDNN_STATUS_SUCCESS && bytes > 0)
    workspace = tensor::empty({static_cast<std::int64_t>(bytes)}, dtype::uint8, like.where());
  if (status == CUDNN_STATUS_SUCCESS)
    status = run(algorithm, workspace.defined() ? workspace.raw_data() : nullptr, bytes);
  if (not_supported(status)) {
    choices().decline(c.key);
    say_declined(c.key, c.lib.error_string(status));
    return false;
  }
  TROUPE_CUDNN_CHECK(status);
  return true;
}

/// What cuDNN needs to run a convolution: the library, the stream's handle,
/// the sizes, the data type and troupe's output shape.
struct taken_convolution {
  const cudnn_library* lib;
  cudnnHandle_t handle;
  conv_sizes sizes;
  cudnnDataType_t type;
  std::array<int, 4> output;
};

/// The convolution as cuDNN takes it; nullopt when cuDNN is not to run it
/// (cudnn_convolution.hpp lists why).
std::optional<taken_convolution> take(execution_stream& queue, const tensor& input, const tensor& weight,
                                      const conv_geometry& g) {
  taken_convolution taken{wanted(), nullptr, {}, {}, {}};
  if (taken.lib == nullptr || !data_type_of(input.type(), taken.type) || !sizes_of(input, weight, g, taken.sizes))
    return std::nullopt;
  taken.output = troupe_output_dims(taken.sizes, g);
  taken.handle = handle_of(queue, *taken.lib);
  if (taken.handle == nullptr)
    return std::nullopt;
  return taken;
}

} // namespace

bool cudnn_conv2d(execution_stream& queue, const tensor& input, const tensor& weight, const conv_geometry& g,
                  tensor& out) {
  const auto taken = take(queue, input, weight, g);
  if (!taken)
    return false;
  const auto& [lib, handle, sizes, type, output] = *taken;
  const descriptors d(*lib, type, sizes, g);
  call c{*lib, handle, d, {out.where().index, type, sizes, pass::forward}, output};
  return run_pass(
    c, out,
    [&](int algorithm, std::size_t& bytes) {
      return lib->forward_workspace(c.handle, c.d.input, c.d.weight, c.d.convolution, c.d.output,
                                    static_cast<cudnnConvolutionFwdAlgo_t>(algorithm), &bytes);
    },
    [&](int algorithm, void* workspace, std::size_t bytes) {
      return lib->forward(c.handle, c.alpha(), c.d.input, input.raw_data(), c.d.weight, weight.raw_data(),
                          c.d.convolution, static_cast<cudnnConvolutionFwdAlgo_t>(algorithm), workspace, bytes,
                          c.beta(), c.d.output, out.raw_data());
    });
}

bool cudnn_conv2d_backward(execution_stream& queue, const tensor& grad, const tensor& input, const tensor& weight,
                           const conv_geometry& g, tensor& grad_input, tensor& grad_weight) {
  const auto taken = take(queue, input, weight, g);
  if (!taken)
    return false;
  const auto& [lib, handle, sizes, type, output] = *taken;
  // Both passes are chosen before either runs, so that a decline leaves
  // both gradients to troupe's kernels, not one of each.
  const descriptors d(*lib, type, sizes, g);
  call data{*lib, handle, d, {grad.where().index, type, sizes, pass::backward_data}, output};
  call filter{*lib, handle, d, {grad.where().index, type, sizes, pass::backward_filter}, output};
  const bool input_grad = grad_input.defined();
  if ((input_grad && algorithm_for(data) < 0) || algorithm_for(filter) < 0)
    return false;
  const bool input_done = !input_grad || run_pass(
    data, grad_input,
    [&](int algorithm, std::size_t& bytes) {
      return lib->backward_data_workspace(handle, data.d.weight, data.d.output, data.d.convolution, data.d.input,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algorithm), &bytes);
    },
    [&](int algorithm, void* workspace, std::size_t bytes) {
      return lib->backward_data(handle, data.alpha(), data.d.weight, weight.raw_data(), data.d.output,
                                grad.raw_data(), data.d.convolution,
                                static_cast<cudnnConvolutionBwdDataAlgo_t>(algorithm), workspace, bytes, data.beta(),
                                data.d.input, grad_input.raw_data());
    });
  if (!input_done)
    return false;
  const bool weight_done = run_pass(
    filter, grad_weight,
    [&](int algorithm, std::size_t& bytes) {
      return lib->backward_filter_workspace(handle, filter.d.input, filter.d.output, filter.d.convolution,
                                            filter.d.weight, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algorithm),
                                            &bytes);
    },
    [&](int algorithm, void* workspace, std::size_t bytes) {
      return lib->backward_filter(handle, filter.alpha(), filter.d.input, input.raw_data(), filter.d.output,
                                  grad.raw_data(), filter.d.convolution,
                                  static_cast<cudnnConvolutionBwdFilterAlgo_t>(algorithm), workspace, bytes,
                                  filter.beta(), filter.d.weight, grad_weight.raw_data());
    });
  // A weight pass declined after the input pass ran: troupe's kernels
  // compute both again (they overwrite both), so the two stay consistent.
  return weight_done;
}

std::optional<std::array<int, 4>> cudnn_output_shape(const tensor& input, const tensor& weight,
                                                     const conv_geometry& g) {
  const auto* lib = wanted();
  cudnnDataType_t type{};
  conv_sizes sizes{};
  if (lib == nullptr || !data_type_of(input.type(), type) || !sizes_of(input, weight, g, sizes))
    return std::nullopt;
  const descriptors d(*lib, type, sizes, g);
  return output_dims(*lib, d);
}

std::string cudnn_convolution_summary() {
  if (turned_off())
    return "troupe's kernels (im2col, cuBLAS GEMM, col2im): cuDNN turned off by TROUPE_CUDNN";
  const auto* lib = cudnn_library::get();
  if (lib == nullptr)
    return fmt::format("troupe's kernels (im2col, cuBLAS GEMM, col2im): {}", cudnn_library::unavailable_reason());
  if (handles_failed.load(std::memory_order_relaxed))
    return "troupe's kernels (im2col, cuBLAS GEMM, col2im): cuDNN could not make a handle on a device";
  const auto version = lib->get_version();
  return fmt::format("cuDNN {}.{}.{} (deterministic algorithms, no TF32; troupe's kernels where it has none)",
                     version / 10000, version / 100 % 100, version % 100);
}

} // namespace troupe::detail::cuda
