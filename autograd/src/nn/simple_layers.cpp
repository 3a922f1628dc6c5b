// Parameterless layers: relu, gelu, dropout, max_pool2d.
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/dropout.hpp"
#include "troupe/autograd/nn/gelu.hpp"
#include "troupe/autograd/nn/max_pool2d.hpp"
#include "troupe/autograd/nn/relu.hpp"

namespace troupe::nn {

variable relu::forward(const variable& input) {
  return autograd::relu(input);
}

variable gelu::forward(const variable& input) {
  return autograd::gelu(input, approximate_);
}

dropout::dropout(double p) : p_(p) {
  require(p >= 0.0 && p < 1.0, "dropout: p is {} but must be in [0, 1)", p);
}

variable dropout::forward(const variable& input) {
  if (!is_training() || p_ == 0.0)
    return input;
  return autograd::dropout(input, p_, true);
}

variable max_pool2d::forward(const variable& input) {
  return autograd::max_pool2d(input, options_);
}

} // namespace troupe::nn
