#pragma once
// Stochastic gradient descent with momentum (PyTorch's torch.optim.SGD).
#include "troupe/autograd/optim/optimizer.hpp"

namespace troupe::optim {

struct sgd_options {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false; ///< requires momentum > 0 and dampening == 0
};

/// Per element, with g the gradient and p the parameter:
///   g += weight_decay * p
///   buf = g on the first step, else momentum * buf + (1 - dampening) * g
///   g = nesterov ? g + momentum * buf : buf      (when momentum != 0)
///   p -= lr * g
/// State: `<param>.momentum_buffer` (when momentum != 0).
class sgd : public optimizer {
public:
  sgd(named_variables parameters, const sgd_options& options);

  double learning_rate() const override { return options_.lr; }
  void set_learning_rate(double lr) override { options_.lr = lr; }
  const sgd_options& options() const noexcept { return options_; }

protected:
  std::vector<std::string> state_names() const override;
  void update(std::size_t index, variable& parameter, const tensor& grad,
              std::vector<tensor>& state) override;

private:
  sgd_options options_;
};

} // namespace troupe::optim
