#pragma once
// Rectified linear unit.
#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

class relu : public module {
public:
  variable forward(const variable& input) override;
};

} // namespace troupe::nn
