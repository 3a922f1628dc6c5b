#pragma once
// GELU: exact, x * Phi(x) (PyTorch's default), or its tanh approximation
// (nn.GELU(approximate='tanh')).
#include "troupe/autograd/nn/module.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

class gelu : public module {
public:
  explicit gelu(gelu_approximation approximate = gelu_approximation::none) : approximate_(approximate) {}
  variable forward(const variable& input) override;

private:
  gelu_approximation approximate_;
};

} // namespace troupe::nn
