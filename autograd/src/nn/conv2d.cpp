#include "troupe/autograd/nn/conv2d.hpp"

#include "init.hpp"
#include "troupe/autograd/functions.hpp"

namespace troupe::nn {

conv2d::conv2d(const conv2d_options& options) : options_(options) {
  require(options.in_channels > 0 && options.out_channels > 0 && options.kernel_size > 0,
          "conv2d: channels and kernel size must be positive, got in {} out {} kernel {}",
          options.in_channels, options.out_channels, options.kernel_size);
  require(options.stride > 0 && options.padding >= 0, "conv2d: stride {} must be positive and padding {} >= 0",
          options.stride, options.padding);
  auto k = options.kernel_size;
  weight_ = register_parameter(
    "weight", variable(tensor::zeros({options.out_channels, options.in_channels, k, k}, options.type)));
  if (options.bias)
    bias_ = register_parameter("bias", variable(tensor::zeros({options.out_channels}, options.type)));
  reset_parameters(options.seed);
}

variable conv2d::forward(const variable& input) {
  return autograd::conv2d(input, weight_, bias_,
                          troupe::conv2d_options{.stride = options_.stride, .padding = options_.padding});
}

void conv2d::init_parameter(const std::string&, tensor& data, generator& gen) {
  detail::init_fan_in_uniform(data, options_.in_channels * options_.kernel_size * options_.kernel_size, gen);
}

} // namespace troupe::nn
