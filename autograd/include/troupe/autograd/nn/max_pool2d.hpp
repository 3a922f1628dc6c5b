#pragma once
// 2-D max pooling over NCHW input.
#include "troupe/autograd/nn/module.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

/// No parameters. Options are troupe::pool2d_options (kernel, stride).
class max_pool2d : public module {
public:
  explicit max_pool2d(pool2d_options options = {}) : options_(options) {}

  variable forward(const variable& input) override;

  const pool2d_options& options() const noexcept { return options_; }

private:
  pool2d_options options_;
};

} // namespace troupe::nn
