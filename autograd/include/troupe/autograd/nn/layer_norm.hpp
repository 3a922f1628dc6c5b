#pragma once
// Layer normalisation over the last dimension.
#include <cstdint>

#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

struct layer_norm_options {
  std::int64_t normalized_size = 0; ///< size of the last dimension
  double eps = 1e-5;
  /// Learnable weight (ones) and bias (zeros).
  bool elementwise_affine = true;
  dtype type = dtype::float32;
};

class layer_norm : public module {
public:
  explicit layer_norm(const layer_norm_options& options);
  explicit layer_norm(std::int64_t normalized_size, double eps = 1e-5);

  variable forward(const variable& input) override;

  const variable& weight() const noexcept { return weight_; }
  const variable& bias() const noexcept { return bias_; }
  const layer_norm_options& options() const noexcept { return options_; }

protected:
  void init_parameter(const std::string& name, tensor& data, generator& gen) override;

private:
  layer_norm_options options_;
  variable weight_;
  variable bias_;
};

} // namespace troupe::nn
