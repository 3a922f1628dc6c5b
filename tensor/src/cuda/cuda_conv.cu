// Convolution and pooling kernels of the CUDA backend (cuda_kernels.hpp):
// im2col and its adjoint col2im (the GEMM between them is cuBLAS's), max
// pooling and its gradient. They mirror cpu_nn.cpp.
#include "cuda_device_common.cuh"

namespace troupe::detail::cuda {

namespace {

#define TROUPE_FOR_EACH(e, total)                                                                   \
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < (total); \
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

struct image_strides {
  std::int64_t c, y, x;
};

// One thread per element of cols [c * kh * kw, oh * ow].
template <class T> __global__ void im2col_kernel(const T* image, image_strides s, conv_shape g, T* cols) {
  const auto plane = g.out_h * g.out_w;
  TROUPE_FOR_EACH(e, g.channels * g.kernel_h * g.kernel_w * plane) {
    const auto row = e / plane;
    const auto position = e % plane;
    const auto c = row / (g.kernel_h * g.kernel_w);
    const auto ki = (row / g.kernel_w) % g.kernel_h;
    const auto kj = row % g.kernel_w;
    const auto iy = (position / g.out_w) * g.stride - g.padding + ki;
    const auto ix = (position % g.out_w) * g.stride - g.padding + kj;
    const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
    cols[e] = inside ? image[c * s.c + iy * s.y + ix * s.x] : T(0);
  }
}

// One thread per image pixel, summing every column entry that im2col read
// from it (a gather, so no two threads write one pixel).
template <class T> __global__ void col2im_kernel(const T* cols, conv_shape g, T* image) {
  const auto plane = g.out_h * g.out_w;
  TROUPE_FOR_EACH(e, g.channels * g.height * g.width) {
    const auto c = e / (g.height * g.width);
    const auto iy = (e / g.width) % g.height;
    const auto ix = e % g.width;
    T sum = T(0);
    for (std::int64_t ki = 0; ki < g.kernel_h; ++ki) {
      const auto ty = iy + g.padding - ki; // = oy * stride
      if (ty < 0 || ty % g.stride != 0 || ty / g.stride >= g.out_h)
        continue;
      for (std::int64_t kj = 0; kj < g.kernel_w; ++kj) {
        const auto tx = ix + g.padding - kj;
        if (tx < 0 || tx % g.stride != 0 || tx / g.stride >= g.out_w)
          continue;
        const auto row = (c * g.kernel_h + ki) * g.kernel_w + kj;
        sum += cols[row * plane + (ty / g.stride) * g.out_w + tx / g.stride];
      }
    }
    image[e] += sum;
  }
}

template <class T>
__global__ void max_pool2d_kernel(const T* input, std::int64_t planes, std::int64_t h, std::int64_t w,
                                  std::int64_t kernel, std::int64_t stride, std::int64_t oh, std::int64_t ow,
                                  T* output, std::int64_t* indices) {
  TROUPE_FOR_EACH(o, planes * oh * ow) {
    const auto p = o / (oh * ow);
    const auto oy = (o / ow) % oh;
    const auto ox = o % ow;
    const T* in = input + p * h * w;
    // The first maximum in row-major window order wins; NaN is a maximum.
    std::int64_t best_at = (oy * stride) * w + ox * stride;
    T best = in[best_at];
    for (std::int64_t ki = 0; ki < kernel; ++ki)
      for (std::int64_t kj = 0; kj < kernel; ++kj) {
        const auto pos = (oy * stride + ki) * w + ox * stride + kj;
        const T v = in[pos];
        if (!is_nan(best) && (v > best || is_nan(v))) {
          best = v;
          best_at = pos;
        }
      }
    output[o] = best;
    indices[o] = best_at;
  }
}

// One thread per plane, outputs in order: overlapping windows may pick the
// same input, and the sums then follow the CPU's order.
template <class T>
__global__ void max_pool2d_backward_kernel(const T* grad, const std::int64_t* indices, std::int64_t planes,
                                           std::int64_t out_plane, std::int64_t in_plane, T* grad_input) {
  TROUPE_FOR_EACH(p, planes) {
    for (std::int64_t o = 0; o < out_plane; ++o)
      grad_input[p * in_plane + indices[p * out_plane + o]] += grad[p * out_plane + o];
  }
}

#undef TROUPE_FOR_EACH

std::int64_t blocks_of(std::int64_t total) {
  return (total + block_size - 1) / block_size;
}

} // namespace

void launch_im2col(element type, const void* image, const std::int64_t* image_strides_, const conv_shape& g,
                   void* cols, cudaStream_t stream) {
  const image_strides s{image_strides_[0], image_strides_[1], image_strides_[2]};
  dispatch_arithmetic(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(im2col_kernel<T>, blocks_of(g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w),
                  block_size, stream, static_cast<const T*>(image), s, g, static_cast<T*>(cols));
  });
}

void launch_col2im(element type, const void* cols, const conv_shape& g, void* image, cudaStream_t stream) {
  dispatch_arithmetic(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(col2im_kernel<T>, blocks_of(g.channels * g.height * g.width), block_size, stream,
                  static_cast<const T*>(cols), g, static_cast<T*>(image));
  });
}

void launch_max_pool2d(element type, const void* input, std::int64_t planes, std::int64_t h, std::int64_t w,
                       std::int64_t kernel, std::int64_t stride, std::int64_t oh, std::int64_t ow, void* output,
                       std::int64_t* indices, cudaStream_t stream) {
  dispatch_arithmetic(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(max_pool2d_kernel<T>, blocks_of(planes * oh * ow), block_size, stream,
                  static_cast<const T*>(input), planes, h, w, kernel, stride, oh, ow, static_cast<T*>(output),
                  indices);
  });
}

void launch_max_pool2d_backward(element type, const void* grad, const std::int64_t* indices, std::int64_t planes,
                                std::int64_t out_plane, std::int64_t in_plane, void* grad_input,
                                cudaStream_t stream) {
  dispatch_arithmetic(type, [&](auto t) {
    using T = typename decltype(t)::type;
    launch_blocks(max_pool2d_backward_kernel<T>, blocks_of(planes), block_size, stream,
                  static_cast<const T*>(grad), indices, planes, out_plane, in_plane, static_cast<T*>(grad_input));
  });
}

} // namespace troupe::detail::cuda
