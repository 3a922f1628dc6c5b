#include "troupe/autograd/nn/linear.hpp"

#include "init.hpp"
#include "troupe/autograd/functions.hpp"

namespace troupe::nn {

linear::linear(const linear_options& options) : options_(options) {
  require(options.in_features > 0 && options.out_features > 0,
          "linear: sizes must be positive, got in_features {} and out_features {}", options.in_features,
          options.out_features);
  weight_ = register_parameter(
    "weight", variable(tensor::zeros({options.out_features, options.in_features}, options.type)));
  if (options.bias)
    bias_ = register_parameter("bias", variable(tensor::zeros({options.out_features}, options.type)));
  reset_parameters(options.seed);
}

linear::linear(std::int64_t in_features, std::int64_t out_features, std::uint64_t seed)
  : linear(linear_options{.in_features = in_features, .out_features = out_features, .seed = seed}) {}

variable linear::forward(const variable& input) {
  return autograd::linear(input, weight_, bias_);
}

void linear::init_parameter(const std::string&, tensor& data, generator& gen) {
  detail::init_fan_in_uniform(data, options_.in_features, gen);
}

} // namespace troupe::nn
