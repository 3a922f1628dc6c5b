#pragma once
// Inverted dropout; the identity in eval mode.
#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

/// Drops elements with probability p while training and scales the rest by
/// 1/(1-p); masks come from the default generator (so checkpoint
/// recomputation replays them). Throws usage_error unless 0 <= p < 1.
class dropout : public module {
public:
  explicit dropout(double p = 0.5);

  variable forward(const variable& input) override;

  double p() const noexcept { return p_; }

private:
  double p_;
};

} // namespace troupe::nn
