#include "troupe/autograd/optim/adam.hpp"

#include <cmath>

#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::optim {

adam::adam(named_variables parameters, const adam_options& options) : adam(std::move(parameters), options, false) {}

adam::adam(named_variables parameters, const adam_options& options, bool decoupled_weight_decay)
  : optimizer(std::move(parameters)), options_(options), decoupled_(decoupled_weight_decay) {
  require(options.lr >= 0.0, "adam: lr is {} but must be >= 0", options.lr);
  require(options.beta1 >= 0.0 && options.beta1 < 1.0 && options.beta2 >= 0.0 && options.beta2 < 1.0,
          "adam: betas ({}, {}) must be in [0, 1)", options.beta1, options.beta2);
  require(options.eps >= 0.0, "adam: eps is {} but must be >= 0", options.eps);
  require(options.weight_decay >= 0.0, "adam: weight_decay is {} but must be >= 0", options.weight_decay);
}

std::vector<std::string> adam::state_names() const {
  return {"exp_avg", "exp_avg_sq"};
}

std::vector<std::string> adam::scalar_state_names() const {
  return {"step"};
}

void adam::update(std::size_t, variable& parameter, const tensor& grad, std::vector<tensor>& state) {
  const auto& o = options_;
  tensor data = parameter.data();
  if (state.empty()) {
    state.push_back(tensor::zeros(data.shape(), data.type(), data.where()));
    state.push_back(tensor::zeros(data.shape(), data.type(), data.where()));
    state.push_back(tensor::scalar(0.0, dtype::int64));
  }
  auto& step = *state[2].data<std::int64_t>();
  ++step;
  const double t = static_cast<double>(step);
  const double step_size = o.lr / (1.0 - std::pow(o.beta1, t));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));
  const double l2 = decoupled_ ? 0.0 : o.weight_decay;
  const double decay = decoupled_ ? 1.0 - o.lr * o.weight_decay : 1.0;
  // One fused pass on the parameter's device (the CPU's: tensor/src/cpu_optim.cpp).
  backend_for(data.where(), "adam")
    .adam_step(data, grad, state[0], state[1],
               adam_step_args{o.beta1, o.beta2, o.eps, step_size, bias_correction2_sqrt, l2, decay});
}

} // namespace troupe::optim
