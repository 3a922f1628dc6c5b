#pragma once
// Linear (fully connected) layer: y = x W^T + b.
#include <cstdint>

#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

struct linear_options {
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  bool bias = true;
  dtype type = dtype::float32;
  /// Seed of the initial values (see module::reset_parameters).
  std::uint64_t seed = 0;
};

/// weight [out, in], bias [out]; both start uniform in ±1/sqrt(in)
/// (PyTorch's kaiming-uniform with a = sqrt(5)). Input [..., in] →
/// output [..., out].
class linear : public module {
public:
  explicit linear(const linear_options& options);
  linear(std::int64_t in_features, std::int64_t out_features, std::uint64_t seed = 0);

  variable forward(const variable& input) override;

  const variable& weight() const noexcept { return weight_; }
  /// Undefined when built without bias.
  const variable& bias() const noexcept { return bias_; }
  const linear_options& options() const noexcept { return options_; }

protected:
  void init_parameter(const std::string& name, tensor& data, generator& gen) override;

private:
  linear_options options_;
  variable weight_;
  variable bias_;
};

} // namespace troupe::nn
