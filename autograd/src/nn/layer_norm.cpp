#include "troupe/autograd/nn/layer_norm.hpp"

#include "troupe/autograd/functions.hpp"

namespace troupe::nn {

layer_norm::layer_norm(const layer_norm_options& options) : options_(options) {
  require(options.normalized_size > 0, "layer_norm: normalized_size must be positive, got {}",
          options.normalized_size);
  if (options.elementwise_affine) {
    weight_ = register_parameter("weight", variable(tensor::ones({options.normalized_size}, options.type)));
    bias_ = register_parameter("bias", variable(tensor::zeros({options.normalized_size}, options.type)));
  }
}

layer_norm::layer_norm(std::int64_t normalized_size, double eps)
  : layer_norm(layer_norm_options{.normalized_size = normalized_size, .eps = eps}) {}

variable layer_norm::forward(const variable& input) {
  require(input.data().rank() >= 1 && input.size(-1) == options_.normalized_size,
          "layer_norm: input {} does not end in {}", input.shape(), options_.normalized_size);
  return autograd::layer_norm(input, weight_, bias_, options_.eps);
}

void layer_norm::init_parameter(const std::string& name, tensor& data, generator&) {
  data.fill(name == "weight" ? 1.0 : 0.0);
}

} // namespace troupe::nn
