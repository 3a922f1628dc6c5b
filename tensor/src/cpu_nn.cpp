// CPU kernels for convolution (im2col/col2im; backend.cpp's conv2d runs
// the GEMM between them), max pooling and layer normalisation. Layer norm
// goes to the AVX2 row kernels of cpu_vector_math.hpp where the CPU has
// them; its loops here are the scalar path (TROUPE_VECTOR_MATH=off).
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "cpu_backend.hpp"
#include "cpu_vector_math.hpp"
#include "dispatch.hpp"
#include "troupe/tensor/parallel_for.hpp"

namespace troupe::detail {

namespace {

/// The output columns [first, last) of kernel column kj whose input column
/// ox * stride - padding + kj lies inside the image; the others read padding.
struct inside_columns {
  std::int64_t first = 0, last = 0;
  inside_columns(const conv_geometry& g, std::int64_t kj) {
    const auto offset = kj - g.padding; // input column of ox = 0
    first = offset >= 0 ? 0 : (-offset + g.stride - 1) / g.stride;
    last = g.width - offset <= 0 ? 0 : (g.width - offset - 1) / g.stride + 1;
    first = std::min(first, g.out_w);
    last = std::clamp(last, first, g.out_w);
  }
};

/// Channels per thread worth waking it for: about 32K elements of cols.
std::int64_t channels_grain(const conv_geometry& g) {
  return std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(g.kernel_h * g.kernel_w * g.out_h * g.out_w, 1));
}

} // namespace

// Row by row: each output row of a kernel offset reads one input row, in a
// run of columns computed once (a copy where stride and layout allow)
// instead of a bounds test per element.
void cpu_backend::im2col(const tensor& image, const conv_geometry& g, tensor& cols) {
  const auto s0 = image.strides()[0];
  const auto s1 = image.strides()[1];
  const auto s2 = image.strides()[2];
  const auto plane = g.out_h * g.out_w;
  dispatch_floating(image.type(), "im2col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = base_of<T>(image) + image.offset();
    T* y = cols.data<T>();
    // Channels apart: each writes its own rows of cols.
    parallel_for(g.channels, channels_grain(g), [&](std::int64_t first_channel, std::int64_t last_channel) {
      for (std::int64_t c = first_channel; c < last_channel; ++c)
        for (std::int64_t ki = 0; ki < g.kernel_h; ++ki)
          for (std::int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const inside_columns inside(g, kj);
            const auto step = g.stride * s2;
            T* row = y + ((c * g.kernel_h + ki) * g.kernel_w + kj) * plane;
            for (std::int64_t oy = 0; oy < g.out_h; ++oy) {
              const auto iy = oy * g.stride - g.padding + ki;
              T* out = row + oy * g.out_w;
              if (iy < 0 || iy >= g.height) {
                std::fill(out, out + g.out_w, T(0));
                continue;
              }
              std::fill(out, out + inside.first, T(0));
              const T* in = x + c * s0 + iy * s1 + (inside.first * g.stride - g.padding + kj) * s2;
              if (step == 1)
                std::copy(in, in + (inside.last - inside.first), out + inside.first);
              else
                for (std::int64_t ox = inside.first; ox < inside.last; ++ox)
                  out[ox] = in[(ox - inside.first) * step];
              std::fill(out + inside.last, out + g.out_w, T(0));
            }
          }
    });
  });
}

void cpu_backend::col2im(const tensor& cols, const conv_geometry& g, tensor& image) {
  const auto plane = g.out_h * g.out_w;
  dispatch_floating(image.type(), "col2im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* y = cols.data<T>();
    T* x = image.data<T>();
    // Channels apart: each adds into its own plane of the image.
    parallel_for(g.channels, channels_grain(g), [&](std::int64_t first_channel, std::int64_t last_channel) {
      for (std::int64_t c = first_channel; c < last_channel; ++c)
        for (std::int64_t ki = 0; ki < g.kernel_h; ++ki)
          for (std::int64_t kj = 0; kj < g.kernel_w; ++kj) {
            const inside_columns inside(g, kj);
            const T* row = y + ((c * g.kernel_h + ki) * g.kernel_w + kj) * plane;
            for (std::int64_t oy = 0; oy < g.out_h; ++oy) {
              const auto iy = oy * g.stride - g.padding + ki;
              if (iy < 0 || iy >= g.height)
                continue;
              T* dst = x + (c * g.height + iy) * g.width + inside.first * g.stride - g.padding + kj;
              const T* src = row + oy * g.out_w + inside.first;
              const auto n = inside.last - inside.first;
              if (g.stride == 1)
                for (std::int64_t i = 0; i < n; ++i)
                  dst[i] += src[i];
              else
                for (std::int64_t i = 0; i < n; ++i)
                  dst[i * g.stride] += src[i];
            }
          }
    });
  });
}

namespace {

/// The maximum of a kernel x kernel window whose first element is `window`
/// (rows `w` apart) and its position in the window (row-major). The first
/// maximum in window order wins; NaN is a maximum, so the first NaN wins.
/// The loop selects rather than branches (whether the next element is
/// larger is a coin toss the branch predictor loses), and ignores NaN;
/// a window that holds one is done again the exact way.
template <class T> std::pair<T, std::int64_t> window_maximum(const T* window, std::int64_t kernel, std::int64_t w) {
  T best = window[0];
  std::int64_t best_at = 0;
  bool nan = false;
  for (std::int64_t ki = 0; ki < kernel; ++ki)
    for (std::int64_t kj = 0; kj < kernel; ++kj) {
      const T v = window[ki * w + kj];
      nan |= v != v;
      const bool take = v > best;
      best = take ? v : best;
      best_at = take ? ki * w + kj : best_at;
    }
  if (!nan)
    return {best, best_at};
  best = window[0];
  best_at = 0;
  for (std::int64_t ki = 0; ki < kernel; ++ki)
    for (std::int64_t kj = 0; kj < kernel; ++kj) {
      const T v = window[ki * w + kj];
      if (!std::isnan(best) && (v > best || std::isnan(v))) {
        best = v;
        best_at = ki * w + kj;
      }
    }
  return {best, best_at};
}

} // namespace

void cpu_backend::max_pool2d(const tensor& input, std::int64_t kernel, std::int64_t stride,
                             tensor& output, tensor& indices) {
  const auto planes = input.size(0) * input.size(1);
  const auto h = input.size(2);
  const auto w = input.size(3);
  const auto oh = output.size(2);
  const auto ow = output.size(3);
  dispatch_floating(input.type(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = input.data<T>();
    T* y = output.data<T>();
    auto* at = indices.data<std::int64_t>();
    // Planes apart; about 32K window elements a thread.
    const auto grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(oh * ow * kernel * kernel, 1));
    parallel_for(planes, grain, [&](std::int64_t first_plane, std::int64_t last_plane) {
      for (std::int64_t p = first_plane; p < last_plane; ++p) {
        const T* in = x + p * h * w;
        for (std::int64_t oy = 0; oy < oh; ++oy)
          for (std::int64_t ox = 0; ox < ow; ++ox) {
            const auto first = (oy * stride) * w + ox * stride;
            const auto [best, best_at] = window_maximum(in + first, kernel, w);
            const auto o = (p * oh + oy) * ow + ox;
            y[o] = best;
            at[o] = first + best_at;
          }
      }
    });
  });
}

void cpu_backend::max_pool2d_backward(const tensor& grad, const tensor& indices,
                                      tensor& grad_input) {
  const auto planes = grad.size(0) * grad.size(1);
  const auto out_plane = grad.size(2) * grad.size(3);
  const auto in_plane = grad_input.size(2) * grad_input.size(3);
  dispatch_floating(grad.type(), "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad.data<T>();
    const auto* at = indices.data<std::int64_t>();
    T* gi = grad_input.data<T>();
    // Planes apart: each adds into its own plane.
    parallel_for(planes, std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(out_plane, 1)),
                 [&](std::int64_t first_plane, std::int64_t last_plane) {
                   for (std::int64_t p = first_plane; p < last_plane; ++p)
                     for (std::int64_t o = 0; o < out_plane; ++o)
                       gi[p * in_plane + at[p * out_plane + o]] += g[p * out_plane + o];
                 });
  });
}

void cpu_backend::layer_norm(const tensor& input, const tensor& weight, const tensor& bias,
                             double eps, tensor& output, tensor& mean, tensor& rstd) {
  const auto d = input.size(-1);
  const auto rows = d == 0 ? 0 : input.numel() / d;
  dispatch_floating(input.type(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = input.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    T* y = output.data<T>();
    T* mu = mean.data<T>();
    T* rs = rstd.data<T>();
    // Rows are independent; the backward sums the weight's gradient over
    // rows in row order and stays on one thread.
    parallel_for(rows, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(d, 1)),
                 [&](std::int64_t first, std::int64_t last) {
                   if (vector_math::available()) {
                     vector_math::layer_norm({.x = x + first * d,
                                              .weight = w,
                                              .bias = b,
                                              .eps = static_cast<T>(eps),
                                              .y = y + first * d,
                                              .mean = mu + first,
                                              .rstd = rs + first,
                                              .rows = last - first,
                                              .d = d});
                     return;
                   }
                   for (std::int64_t r = first; r < last; ++r) {
                     const T* xr = x + r * d;
                     T* yr = y + r * d;
                     // Two passes (mean, then squared deviations) rather than E[x^2] -
                     // E[x]^2, which cancels catastrophically for large means; both
                     // relative to x[0], so a large mean's sum does not lose the spread
                     // (as the vector path's Welford pass).
                     const T shift = xr[0];
                     for (std::int64_t j = 0; j < d; ++j)
                       yr[j] = xr[j] - shift;
                     const T shifted_mean = row_sum(yr, d, 1) / static_cast<T>(d);
                     for (std::int64_t j = 0; j < d; ++j)
                       yr[j] = (yr[j] - shifted_mean) * (yr[j] - shifted_mean);
                     const T var = row_sum(yr, d, 1) / static_cast<T>(d);
                     const T m = shift + shifted_mean;
                     const T inv = T(1) / std::sqrt(var + static_cast<T>(eps));
                     mu[r] = m;
                     rs[r] = inv;
                     // One loop per affine case: a branch inside kept GCC from vectorising.
                     if (w != nullptr && b != nullptr)
                       for (std::int64_t j = 0; j < d; ++j)
                         yr[j] = (xr[j] - m) * inv * w[j] + b[j];
                     else if (w != nullptr)
                       for (std::int64_t j = 0; j < d; ++j)
                         yr[j] = (xr[j] - m) * inv * w[j];
                     else if (b != nullptr)
                       for (std::int64_t j = 0; j < d; ++j)
                         yr[j] = (xr[j] - m) * inv + b[j];
                     else
                       for (std::int64_t j = 0; j < d; ++j)
                         yr[j] = (xr[j] - m) * inv;
                   }
                 });
  });
}

void cpu_backend::layer_norm_backward(const tensor& grad, const tensor& input, const tensor& mean,
                                      const tensor& rstd, const tensor& weight, tensor& grad_input,
                                      tensor& grad_weight, tensor& grad_bias) {
  const auto d = input.size(-1);
  const auto rows = d == 0 ? 0 : input.numel() / d;
  dispatch_floating(input.type(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* g = grad.data<T>();
    const T* x = input.data<T>();
    const T* mu = mean.data<T>();
    const T* rs = rstd.data<T>();
    const T* w = weight.defined() ? weight.data<T>() : nullptr;
    T* gx = grad_input.data<T>();
    T* gw = grad_weight.data<T>();
    T* gb = grad_bias.data<T>();
    if (vector_math::available()) {
      vector_math::layer_norm_backward({.grad = g, .x = x, .mean = mu, .rstd = rs, .weight = w, .grad_input = gx,
                                        .grad_weight = gw, .grad_bias = gb, .rows = rows, .d = d});
      return;
    }
    std::fill(gw, gw + d, T(0));
    std::fill(gb, gb + d, T(0));
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* gr = g + r * d;
      const T* xr = x + r * d;
      T* dr = gx + r * d;
      // With xhat = (x - mean) * rstd and gxhat = grad * weight:
      // dx = rstd * (gxhat - mean(gxhat) - xhat * mean(gxhat * xhat)).
      // The row's statistics in locals: read through pointers that the
      // stores below might alias, they kept the loops scalar. The two sums
      // in eight lanes, as row_sum's blocks.
      const T m = mu[r];
      const T s = rs[r];
      T lane_g[8] = {};
      T lane_gx[8] = {};
      for (std::int64_t j = 0; j < d; ++j) {
        const T xhat = (xr[j] - m) * s;
        const T gh = w != nullptr ? gr[j] * w[j] : gr[j];
        lane_g[j % 8] += gh;
        lane_gx[j % 8] += gh * xhat;
        gw[j] += gr[j] * xhat;
        gb[j] += gr[j];
      }
      const auto lanes_sum = [](const T* l) {
        return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
      };
      const T mean_g = lanes_sum(lane_g) / static_cast<T>(d);
      const T mean_gx = lanes_sum(lane_gx) / static_cast<T>(d);
      for (std::int64_t j = 0; j < d; ++j) {
        const T xhat = (xr[j] - m) * s;
        const T gh = w != nullptr ? gr[j] * w[j] : gr[j];
        dr[j] = s * (gh - mean_g - xhat * mean_gx);
      }
    }
  });
}

} // namespace troupe::detail
