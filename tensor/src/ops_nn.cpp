// Convolution (operand checks, then the backend's conv2d: cuDNN on CUDA,
// im2col + GEMM per image otherwise), max pooling, layer norm and dropout
// masks.
#include "ops_common.hpp"

namespace troupe {

using namespace detail;

namespace {

/// Checks conv2d operands and returns the per-image geometry.
conv_geometry conv_check(const char* op, const tensor& input, const tensor& weight,
                         conv2d_options options) {
  require_defined(op, input, "input");
  require_defined(op, weight, "weight");
  require_same_device(op, input, weight);
  require_same_dtype(op, input, weight);
  require_floating(op, input);
  require(input.rank() == 4, "{}: expected input [n, c, h, w], got {}", op, input.shape());
  require(weight.rank() == 4, "{}: expected weight [o, c, kh, kw], got {}", op, weight.shape());
  require(input.shape()[1] == weight.shape()[1],
          "{}: input channels differ from weight channels: {} and {}", op, input.shape(),
          weight.shape());
  require(options.stride >= 1 && options.padding >= 0,
          "{}: stride must be >= 1 and padding >= 0, got stride {} padding {}", op, options.stride,
          options.padding);
  conv_geometry g;
  g.channels = input.shape()[1];
  g.height = input.shape()[2];
  g.width = input.shape()[3];
  g.kernel_h = weight.shape()[2];
  g.kernel_w = weight.shape()[3];
  g.stride = options.stride;
  g.padding = options.padding;
  require(g.kernel_h >= 1 && g.kernel_w >= 1 && g.height + 2 * g.padding >= g.kernel_h &&
              g.width + 2 * g.padding >= g.kernel_w,
          "{}: kernel {} does not fit input {} with padding {}", op, weight.shape(), input.shape(),
          g.padding);
  g.out_h = (g.height + 2 * g.padding - g.kernel_h) / g.stride + 1;
  g.out_w = (g.width + 2 * g.padding - g.kernel_w) / g.stride + 1;
  return g;
}

} // namespace

tensor conv2d(const tensor& input, const tensor& weight, const tensor& bias,
              conv2d_options options) {
  auto g = conv_check("conv2d", input, weight, options);
  const auto outputs = weight.shape()[0];
  if (bias.defined()) {
    require_same_device("conv2d", input, bias);
    require_same_dtype("conv2d", input, bias);
    require(bias.shape() == dims{outputs}, "conv2d: bias shape {} should be [{}] for weight {}",
            bias.shape(), outputs, weight.shape());
  }
  auto& kernels = backend_for(input.where(), "conv2d");
  auto out = tensor::empty({input.shape()[0], outputs, g.out_h, g.out_w}, input.type(), input.where());
  kernels.conv2d(input.contiguous(), weight.contiguous(), g, out);
  if (bias.defined())
    kernels.axpy(out, bias.reshape({1, outputs, 1, 1}).expand(out.shape()), 1.0);
  return out;
}

conv2d_grads conv2d_backward(const tensor& grad, const tensor& input, const tensor& weight,
                             bool bias_defined, conv2d_options options, bool input_grad) {
  auto g = conv_check("conv2d_backward", input, weight, options);
  require_defined("conv2d_backward", grad, "grad");
  require_same_device("conv2d_backward", grad, input);
  require_same_dtype("conv2d_backward", grad, input);
  const auto n = input.shape()[0];
  const auto outputs = weight.shape()[0];
  const dims expected{n, outputs, g.out_h, g.out_w};
  require(grad.shape() == expected, "conv2d_backward: grad shape {} should be {}", grad.shape(),
          expected);
  auto& kernels = backend_for(input.where(), "conv2d_backward");
  auto grad_input = input_grad ? tensor::empty(input.shape(), input.type(), input.where()) : tensor();
  auto grad_weight = tensor::empty(weight.shape(), input.type(), input.where());
  kernels.conv2d_backward(grad.contiguous(), input.contiguous(), weight.contiguous(), g, grad_input, grad_weight);
  conv2d_grads grads;
  grads.input = grad_input;
  grads.weight = grad_weight;
  if (bias_defined)
    grads.bias = sum(grad, {0, 2, 3});
  return grads;
}

max_pool2d_result max_pool2d(const tensor& input, pool2d_options options) {
  require_defined("max_pool2d", input, "input");
  require_floating("max_pool2d", input);
  require(input.rank() == 4, "max_pool2d: expected input [n, c, h, w], got {}", input.shape());
  require(options.kernel >= 1 && options.stride >= 1,
          "max_pool2d: kernel and stride must be >= 1, got kernel {} stride {}", options.kernel,
          options.stride);
  require(input.shape()[2] >= options.kernel && input.shape()[3] >= options.kernel,
          "max_pool2d: kernel {} larger than input {}", options.kernel, input.shape());
  auto& kernels = backend_for(input.where(), "max_pool2d");
  const auto oh = (input.shape()[2] - options.kernel) / options.stride + 1;
  const auto ow = (input.shape()[3] - options.kernel) / options.stride + 1;
  const dims shape{input.shape()[0], input.shape()[1], oh, ow};
  max_pool2d_result result{tensor::empty(shape, input.type(), input.where()),
                           tensor::empty(shape, dtype::int64, input.where())};
  if (input.numel() > 0)
    kernels.max_pool2d(input.contiguous(), options.kernel, options.stride, result.output,
                       result.indices);
  return result;
}

tensor max_pool2d_backward(const tensor& grad, const tensor& indices, const dims& input_shape) {
  const char* op = "max_pool2d_backward";
  require_defined(op, grad, "grad");
  require_floating(op, grad);
  require_index(op, indices, "indices");
  require_same_device(op, grad, indices);
  require(input_shape.size() == 4, "{}: expected input shape [n, c, h, w], got {}", op, input_shape);
  require(grad.rank() == 4 && grad.shape() == indices.shape() &&
              grad.shape()[0] == input_shape[0] && grad.shape()[1] == input_shape[1],
          "{}: grad {} and indices {} do not match input {}", op, grad.shape(), indices.shape(),
          input_shape);
  auto& kernels = backend_for(grad.where(), op);
  require_indices_below(op, indices, input_shape[2] * input_shape[3], 2, input_shape);
  auto grad_input = tensor::zeros(input_shape, grad.type(), grad.where());
  kernels.max_pool2d_backward(grad.contiguous(), indices.contiguous(), grad_input);
  return grad_input;
}

namespace {

void check_affine(const char* op, const tensor& input, const tensor& t, const char* what) {
  if (!t.defined())
    return;
  require_same_device(op, input, t);
  require_same_dtype(op, input, t);
  require(t.shape() == dims{input.shape().back()}, "{}: {} shape {} should be [{}] for input {}", op,
          what, t.shape(), input.shape().back(), input.shape());
}

dims row_shape(const tensor& input) {
  return dims(input.shape().begin(), input.shape().end() - 1);
}

} // namespace

layer_norm_result layer_norm(const tensor& input, const tensor& weight, const tensor& bias,
                             double eps) {
  require_defined("layer_norm", input, "input");
  require_floating("layer_norm", input);
  require(input.rank() >= 1, "layer_norm: expected at least 1-D input, got {}", input.shape());
  check_affine("layer_norm", input, weight, "weight");
  check_affine("layer_norm", input, bias, "bias");
  auto& kernels = backend_for(input.where(), "layer_norm");
  layer_norm_result result{tensor::empty(input.shape(), input.type(), input.where()),
                           tensor::empty(row_shape(input), input.type(), input.where()),
                           tensor::empty(row_shape(input), input.type(), input.where())};
  kernels.layer_norm(input.contiguous(), weight.defined() ? weight.contiguous() : tensor{},
                     bias.defined() ? bias.contiguous() : tensor{}, eps, result.output, result.mean,
                     result.rstd);
  return result;
}

layer_norm_grads layer_norm_backward(const tensor& grad, const tensor& input,
                                     const layer_norm_result& saved, const tensor& weight) {
  const char* op = "layer_norm_backward";
  require_defined(op, grad, "grad");
  require_defined(op, input, "input");
  require_floating(op, input);
  require(input.rank() >= 1, "{}: expected at least 1-D input, got {}", op, input.shape());
  require_same_device(op, grad, input);
  require_same_dtype(op, grad, input);
  require(grad.shape() == input.shape(), "{}: grad shape {} differs from input shape {}", op,
          grad.shape(), input.shape());
  require(saved.mean.defined() && saved.rstd.defined() && saved.mean.shape() == row_shape(input) &&
              saved.rstd.shape() == row_shape(input),
          "{}: saved mean/rstd do not match input {}", op, input.shape());
  check_affine(op, input, weight, "weight");
  auto& kernels = backend_for(input.where(), op);
  const auto d = input.shape().back();
  layer_norm_grads grads{tensor::empty(input.shape(), input.type(), input.where()),
                         tensor::empty({d}, input.type(), input.where()),
                         tensor::empty({d}, input.type(), input.where())};
  kernels.layer_norm_backward(grad.contiguous(), input.contiguous(), saved.mean.contiguous(),
                              saved.rstd.contiguous(),
                              weight.defined() ? weight.contiguous() : tensor{}, grads.input,
                              grads.weight, grads.bias);
  return grads;
}

tensor dropout_mask(const dims& shape, double p, generator& gen, dtype type, device where) {
  require(p >= 0.0 && p <= 1.0, "dropout_mask: probability {} is outside [0, 1]", p);
  require(type == dtype::float32 || type == dtype::float64,
          "dropout_mask: expected float32 or float64, got {}", type);
  auto& kernels = backend_for(where, "dropout_mask");
  auto out = tensor::empty(shape, type, where);
  // p == 1 drops everything; the keep scale would be infinite but is unused.
  const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  kernels.fill_random(random_distribution::dropout, gen, p, scale, out);
  gen.offset += static_cast<std::uint64_t>(out.numel());
  return out;
}

} // namespace troupe
