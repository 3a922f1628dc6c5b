// Row kernels of the CUDA backend (cuda_kernels.hpp): sums and maxima of
// rows, softmax and its gradient (plain, and causal for attention), cross
// entropy and its gradient, layer norm and its gradients. Each row
// belongs to one block (cuda_device_common.cuh, "block reductions"), so
// results are deterministic; they equal the CPU's (cpu_reduce.cpp,
// cpu_nn.cpp) within float rounding, the order of additions being a tree
// instead of the CPU's eight lanes.
#include <algorithm>

#include "cuda_device_common.cuh"

namespace troupe::detail::cuda {

namespace {

/// A candidate maximum: its value and column (-1: none yet).
template <class T> struct arg_max {
  T value;
  std::int64_t at;
};

/// The better of two candidates: the first NaN, else the larger value, the
/// earlier column on ties — the CPU's "first maximum, NaN wins".
struct better {
  template <class T> __device__ arg_max<T> operator()(arg_max<T> a, arg_max<T> b) const {
    if (a.at < 0)
      return b;
    if (b.at < 0)
      return a;
    const bool a_nan = is_nan(a.value);
    const bool b_nan = is_nan(b.value);
    if (a_nan || b_nan) {
      if (a_nan && b_nan)
        return a.at < b.at ? a : b;
      return a_nan ? a : b;
    }
    if (a.value != b.value)
      return a.value > b.value ? a : b;
    return a.at < b.at ? a : b;
  }
};

template <class T>
__global__ void reduce_rows_kernel(bool reduce_max, const T* a, std::int64_t rows, std::int64_t cols,
                                   std::int64_t row_stride, std::int64_t col_stride, T* values,
                                   std::int64_t* indices) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = a + r * row_stride;
    if (!reduce_max) {
      T partial = T(0);
      for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        partial += row[j * col_stride];
      const T total = block_reduce(partial, plus{});
      if (threadIdx.x == 0)
        values[r] = total;
      continue;
    }
    arg_max<T> best{T(0), -1};
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      best = better{}(best, arg_max<T>{row[j * col_stride], j});
    best = block_reduce(best, better{});
    if (threadIdx.x == 0) {
      values[r] = best.value;
      if (indices != nullptr)
        indices[r] = best.at;
    }
  }
}

struct maximum {
  template <class T> __device__ T operator()(T a, T b) const { return b > a ? b : a; }
};

/// A row's maximum and the sum of exp(scale (x - maximum)) over its first
/// `n` elements (n >= 1), computed by the whole block; every thread gets both.
template <class T> struct exp_sum {
  T top;
  T total;
};

template <class T> __device__ exp_sum<T> exp_sum_of_row(const T* x, std::int64_t n, T scale) {
  T top = x[0];
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x)
    top = maximum{}(top, x[j]);
  top = block_reduce(top, maximum{}); // scale > 0: the maximum of scale x is scale top
  T partial = T(0);
  for (std::int64_t j = threadIdx.x; j < n; j += blockDim.x)
    partial += exp_of(T((x[j] - top) * scale));
  return {top, block_reduce(partial, plus{})};
}

template <class T>
__global__ void softmax_kernel(const T* a, std::int64_t rows, std::int64_t cols, bool log, T* out) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = a + r * cols;
    T* y = out + r * cols;
    const auto [top, total] = exp_sum_of_row(x, cols, T(1));
    if (log) {
      const T shift = top + log_of(total);
      for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        y[j] = x[j] - shift;
    } else {
      const T inv = T(1) / total;
      for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        y[j] = exp_of(T(x[j] - top)) * inv;
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* grad, const T* output, std::int64_t rows, std::int64_t cols,
                                        bool log, T* out) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* g = grad + r * cols;
    const T* y = output + r * cols;
    T* dx = out + r * cols;
    T partial = T(0);
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      partial += log ? g[j] : g[j] * y[j];
    const T total = block_reduce(partial, plus{});
    // log softmax: dx = g - softmax(x) * sum(g); softmax: dx = y * (g - <g, y>).
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dx[j] = log ? T(g[j] - exp_of(y[j]) * total) : T(y[j] * (g[j] - total));
  }
}

/// Row r of a causal [.., queries, cols] score matrix keeps its first
/// min(r % queries + 1, cols) columns; what lies under the mask is never read.
__device__ inline std::int64_t causal_kept(std::int64_t r, std::int64_t queries, std::int64_t cols) {
  const auto kept = r % queries + 1;
  return kept < cols ? kept : cols;
}

// y = softmax(scale x) over the kept columns, 0 under the mask: one kernel
// instead of the default's mask, scale, where and softmax.
template <class T>
__global__ void causal_softmax_kernel(const T* a, std::int64_t rows, std::int64_t queries, std::int64_t cols,
                                      T scale, T* out) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = a + r * cols;
    T* y = out + r * cols;
    const auto kept = causal_kept(r, queries, cols);
    const auto [top, total] = exp_sum_of_row(x, kept, scale);
    const T inv = T(1) / total;
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      y[j] = j < kept ? T(exp_of(T((x[j] - top) * scale)) * inv) : T(0);
  }
}

// dx = scale y (g - <g, y>) over the kept columns, 0 under the mask. `out`
// may be `grad` (the attention's backward works in place): each thread
// reads the elements it writes, and the dot product is complete (a block
// barrier) before any is written.
template <class T>
__global__ void causal_softmax_backward_kernel(const T* grad, const T* output, std::int64_t rows,
                                               std::int64_t queries, std::int64_t cols, T scale, T* out) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* g = grad + r * cols;
    const T* y = output + r * cols;
    T* dx = out + r * cols;
    const auto kept = causal_kept(r, queries, cols);
    T partial = T(0);
    for (std::int64_t j = threadIdx.x; j < kept; j += blockDim.x)
      partial += g[j] * y[j];
    const T dot = block_reduce(partial, plus{});
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dx[j] = j < kept ? T(y[j] * (g[j] - dot) * scale) : T(0);
  }
}

// Each row's log sum exp, and its loss term lse - x[target] in double for
// the second pass.
template <class T>
__global__ void cross_entropy_rows_kernel(const T* logits, const std::int64_t* targets, std::int64_t target_step,
                                          std::int64_t rows, std::int64_t cols, T* log_sum_exp, double* terms) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * cols;
    const auto [top, total] = exp_sum_of_row(x, cols, T(1));
    const T lse = top + log_of(total);
    if (threadIdx.x == 0) {
      log_sum_exp[r] = lse;
      terms[r] = static_cast<double>(lse) - static_cast<double>(x[targets[r * target_step]]);
    }
  }
}

// loss = the mean of the terms, summed in double by one block in a fixed
// order (as the CPU sums them in double).
template <class T> __global__ void cross_entropy_mean_kernel(const double* terms, std::int64_t rows, T* loss) {
  double partial = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    partial += terms[r];
  const double total = block_reduce(partial, plus{});
  if (threadIdx.x == 0)
    *loss = static_cast<T>(total / static_cast<double>(rows));
}

// dx = grad (exp(x - lse) - onehot(target)) / rows, with grad read on the
// device (no wait for the loss on the host).
template <class T>
__global__ void cross_entropy_backward_kernel(const T* grad, const T* logits, const std::int64_t* targets,
                                              std::int64_t target_step, const T* log_sum_exp, std::int64_t lse_step,
                                              std::int64_t rows, std::int64_t cols, T* out) {
  const T scale = static_cast<T>(static_cast<double>(*grad) / static_cast<double>(rows));
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * cols;
    T* dx = out + r * cols;
    const T shift = log_sum_exp[r * lse_step];
    const auto target = targets[r * target_step];
    for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      T value = exp_of(T(x[j] - shift)) * scale;
      if (j == target)
        value -= scale;
      dx[j] = value;
    }
  }
}

template <class T>
__global__ void layer_norm_kernel(const T* input, const T* weight, const T* bias, std::int64_t rows,
                                  std::int64_t d, double eps, T* output, T* mean, T* rstd) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = input + r * d;
    T* y = output + r * d;
    // Two passes (mean, then squared deviations), as on the CPU.
    T partial = T(0);
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x)
      partial += x[j];
    const T m = block_reduce(partial, plus{}) / static_cast<T>(d);
    partial = T(0);
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x)
      partial += (x[j] - m) * (x[j] - m);
    const T var = block_reduce(partial, plus{}) / static_cast<T>(d);
    const T inv = T(1) / sqrt_of(T(var + static_cast<T>(eps)));
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = inv;
    }
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      T v = (x[j] - m) * inv;
      if (weight != nullptr)
        v *= weight[j];
      if (bias != nullptr)
        v += bias[j];
      y[j] = v;
    }
  }
}

template <class T>
__global__ void layer_norm_input_grad_kernel(const T* grad, const T* input, const T* mean, const T* rstd,
                                             const T* weight, std::int64_t rows, std::int64_t d, T* grad_input) {
  // With xhat = (x - mean) * rstd and gxhat = grad * weight:
  // dx = rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)).
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* g = grad + r * d;
    const T* x = input + r * d;
    const T mu = mean[r];
    const T rs = rstd[r];
    T sum_g = T(0);
    T sum_gx = T(0);
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const T gxhat = weight != nullptr ? g[j] * weight[j] : g[j];
      sum_g += gxhat;
      sum_gx += gxhat * ((x[j] - mu) * rs);
    }
    const T mean_g = block_reduce(sum_g, plus{}) / static_cast<T>(d);
    const T mean_gx = block_reduce(sum_gx, plus{}) / static_cast<T>(d);
    for (std::int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const T xhat = (x[j] - mu) * rs;
      const T gxhat = weight != nullptr ? g[j] * weight[j] : g[j];
      grad_input[r * d + j] = rs * (gxhat - mean_g - xhat * mean_gx);
    }
  }
}

// One thread per column, rows in order: deterministic without atomics.
/// Rows per chunk of the parameter gradients' first pass (more when the
/// chunks would outnumber a grid's y dimension).
constexpr std::int64_t param_grad_chunk = 64;
constexpr std::int64_t max_grid_y = 65535;

// The parameter gradients sum over rows: a thread per column would leave
// the GPU nearly idle at GPT widths, so the first pass gives each block a
// chunk of rows (partial sums per chunk and column, coalesced across the
// columns) and the second sums a column's chunks in order: deterministic.
template <class T>
__global__ void layer_norm_param_grad_partial_kernel(const T* grad, const T* input, const T* mean, const T* rstd,
                                                     std::int64_t rows, std::int64_t d, std::int64_t chunk_rows,
                                                     T* partial_weight, T* partial_bias) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  if (j >= d)
    return;
  const std::int64_t end = min(rows, (chunk + 1) * chunk_rows);
  T gw = T(0);
  T gb = T(0);
  for (std::int64_t r = chunk * chunk_rows; r < end; ++r) {
    const T g = grad[r * d + j];
    gw += g * ((input[r * d + j] - mean[r]) * rstd[r]);
    gb += g;
  }
  partial_weight[chunk * d + j] = gw;
  partial_bias[chunk * d + j] = gb;
}

template <class T>
__global__ void layer_norm_param_grad_sum_kernel(const T* partial_weight, const T* partial_bias,
                                                 std::int64_t chunks, std::int64_t d, T* grad_weight,
                                                 T* grad_bias) {
  for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < d;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    T gw = T(0);
    T gb = T(0);
    for (std::int64_t c = 0; c < chunks; ++c) {
      gw += partial_weight[c * d + j];
      gb += partial_bias[c * d + j];
    }
    grad_weight[j] = gw;
    grad_bias[j] = gb;
  }
}

template <class F> void dispatch_floating(element type, F&& f) {
  if (type == element::float32)
    f(tag<float>{});
  else if (type == element::float64)
    f(tag<double>{});
}

} // namespace

void launch_reduce_rows(bool reduce_max, element type, const void* a, std::int64_t rows, std::int64_t cols,
                        std::int64_t row_stride, std::int64_t col_stride, void* values, std::int64_t* indices,
                        cudaStream_t stream) {
  dispatch_arithmetic(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(reduce_rows_kernel<T>, rows, threads_for(cols), stream, reduce_max, static_cast<const T*>(a),
                  rows, cols, row_stride, col_stride, static_cast<T*>(values), indices);
  });
}

void launch_softmax(element type, const void* a, std::int64_t rows, std::int64_t cols, bool log, void* out,
                    cudaStream_t stream) {
  if (cols == 0)
    return;
  dispatch_floating(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(softmax_kernel<T>, rows, threads_for(cols), stream, static_cast<const T*>(a), rows, cols, log,
                  static_cast<T*>(out));
  });
}

void launch_softmax_backward(element type, const void* grad, const void* output, std::int64_t rows,
                             std::int64_t cols, bool log, void* out, cudaStream_t stream) {
  if (cols == 0)
    return;
  dispatch_floating(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(softmax_backward_kernel<T>, rows, threads_for(cols), stream, static_cast<const T*>(grad),
                  static_cast<const T*>(output), rows, cols, log, static_cast<T*>(out));
  });
}

void launch_causal_softmax(element type, const void* a, std::int64_t rows, std::int64_t queries, std::int64_t cols,
                           double scale, void* out, cudaStream_t stream) {
  if (cols == 0)
    return;
  dispatch_floating(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(causal_softmax_kernel<T>, rows, threads_for(cols), stream, static_cast<const T*>(a), rows, queries,
                  cols, static_cast<T>(scale), static_cast<T*>(out));
  });
}

void launch_causal_softmax_backward(element type, const void* grad, const void* output, std::int64_t rows,
                                    std::int64_t queries, std::int64_t cols, double scale, void* out,
                                    cudaStream_t stream) {
  if (cols == 0)
    return;
  dispatch_floating(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(causal_softmax_backward_kernel<T>, rows, threads_for(cols), stream, static_cast<const T*>(grad),
                  static_cast<const T*>(output), rows, queries, cols, static_cast<T>(scale), static_cast<T*>(out));
  });
}

void launch_cross_entropy(element type, const void* logits, const std::int64_t* targets, std::int64_t target_step,
                          std::int64_t rows, std::int64_t cols, void* loss, void* log_sum_exp, cudaStream_t stream) {
  if (rows == 0 || cols == 0)
    return;
  dispatch_floating(type, [&](auto t) {
    using T = typename decltype(t)::type;
    // Stream-ordered scratch: freed once the second pass has run.
    double* terms = nullptr;
    TROUPE_CUDA_CHECK(cudaMallocAsync(&terms, static_cast<std::size_t>(rows) * sizeof(double), stream));
    launch_blocks(cross_entropy_rows_kernel<T>, rows, threads_for(cols), stream, static_cast<const T*>(logits),
                  targets, target_step, rows, cols, static_cast<T*>(log_sum_exp), terms);
    launch_blocks(cross_entropy_mean_kernel<T>, 1, threads_for(rows), stream, static_cast<const double*>(terms), rows,
                  static_cast<T*>(loss));
    TROUPE_CUDA_CHECK(cudaFreeAsync(terms, stream));
  });
}

void launch_cross_entropy_backward(element type, const void* grad, const void* logits, const std::int64_t* targets,
                                   std::int64_t target_step, const void* log_sum_exp, std::int64_t lse_step,
                                   std::int64_t rows, std::int64_t cols, void* out, cudaStream_t stream) {
  if (cols == 0)
    return;
  dispatch_floating(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(cross_entropy_backward_kernel<T>, rows, threads_for(cols), stream, static_cast<const T*>(grad),
                  static_cast<const T*>(logits), targets, target_step, static_cast<const T*>(log_sum_exp), lse_step,
                  rows, cols, static_cast<T*>(out));
  });
}

void launch_layer_norm(element type, const void* input, const void* weight, const void* bias, std::int64_t rows,
                       std::int64_t d, double eps, void* output, void* mean, void* rstd, cudaStream_t stream) {
  if (d == 0)
    return;
  dispatch_floating(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(layer_norm_kernel<T>, rows, threads_for(d), stream, static_cast<const T*>(input),
                  static_cast<const T*>(weight), static_cast<const T*>(bias), rows, d, eps, static_cast<T*>(output),
                  static_cast<T*>(mean), static_cast<T*>(rstd));
  });
}

void launch_layer_norm_backward(element type, const void* grad, const void* input, const void* mean,
                                const void* rstd, const void* weight, std::int64_t rows, std::int64_t d,
                                void* grad_input, void* grad_weight, void* grad_bias, cudaStream_t stream) {
  if (d == 0)
    return;
  dispatch_floating(type, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto* g = static_cast<const T*>(grad);
    const auto* x = static_cast<const T*>(input);
    const auto* mu = static_cast<const T*>(mean);
    const auto* rs = static_cast<const T*>(rstd);
    launch_blocks(layer_norm_input_grad_kernel<T>, rows, threads_for(d), stream, g, x, mu, rs,
                  static_cast<const T*>(weight), rows, d, static_cast<T*>(grad_input));
    const std::int64_t chunk_rows = std::max(param_grad_chunk, (rows + max_grid_y - 1) / max_grid_y);
    const std::int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    if (chunks == 0) {
      TROUPE_CUDA_CHECK(cudaMemsetAsync(grad_weight, 0, static_cast<std::size_t>(d) * sizeof(T), stream));
      TROUPE_CUDA_CHECK(cudaMemsetAsync(grad_bias, 0, static_cast<std::size_t>(d) * sizeof(T), stream));
      return;
    }
    // Stream-ordered scratch: freed once the second pass has run.
    T* partial = nullptr;
    TROUPE_CUDA_CHECK(cudaMallocAsync(&partial, static_cast<std::size_t>(2 * chunks * d) * sizeof(T), stream));
    const dim3 grid(static_cast<unsigned>((d + block_size - 1) / block_size), static_cast<unsigned>(chunks));
    TROUPE_LAUNCH(layer_norm_param_grad_partial_kernel<T>, grid, block_size, stream)(g, x, mu, rs, rows, d,
                                                                                    chunk_rows, partial,
                                                                                    partial + chunks * d);
    TROUPE_CUDA_CHECK(cudaGetLastError());
    launch_blocks(layer_norm_param_grad_sum_kernel<T>, (d + block_size - 1) / block_size, block_size, stream,
                  static_cast<const T*>(partial), static_cast<const T*>(partial + chunks * d), chunks, d,
                  static_cast<T*>(grad_weight), static_cast<T*>(grad_bias));
    TROUPE_CUDA_CHECK(cudaFreeAsync(partial, stream));
  });
}

} // namespace troupe::detail::cuda
