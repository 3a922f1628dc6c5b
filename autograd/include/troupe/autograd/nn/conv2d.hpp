#pragma once
// 2-D convolution over NCHW input.
#include <cstdint>

#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

struct conv2d_options {
  std::int64_t in_channels = 0;
  std::int64_t out_channels = 0;
  std::int64_t kernel_size = 1; ///< square kernel
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  bool bias = true;
  dtype type = dtype::float32;
  std::uint64_t seed = 0;
};

/// weight [out, in, k, k], bias [out]; both uniform in ±1/sqrt(in * k * k).
/// Input [n, in, h, w] → [n, out, h', w'].
class conv2d : public module {
public:
  explicit conv2d(const conv2d_options& options);

  variable forward(const variable& input) override;

  const variable& weight() const noexcept { return weight_; }
  const variable& bias() const noexcept { return bias_; }
  const conv2d_options& options() const noexcept { return options_; }

protected:
  void init_parameter(const std::string& name, tensor& data, generator& gen) override;

private:
  conv2d_options options_;
  variable weight_;
  variable bias_;
};

} // namespace troupe::nn
