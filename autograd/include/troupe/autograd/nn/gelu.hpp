#pragma once
// Exact GELU, x * Phi(x) (PyTorch's default, not the tanh approximation).
#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

class gelu : public module {
public:
  variable forward(const variable& input) override;
};

} // namespace troupe::nn
