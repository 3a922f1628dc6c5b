#include "troupe/autograd/optim/sgd.hpp"

#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::optim {

sgd::sgd(named_variables parameters, const sgd_options& options)
  : optimizer(std::move(parameters)), options_(options) {
  require(options.lr >= 0.0, "sgd: lr is {} but must be >= 0", options.lr);
  require(options.momentum >= 0.0, "sgd: momentum is {} but must be >= 0", options.momentum);
  require(options.weight_decay >= 0.0, "sgd: weight_decay is {} but must be >= 0", options.weight_decay);
  require(!options.nesterov || (options.momentum > 0.0 && options.dampening == 0.0),
          "sgd: nesterov needs momentum > 0 and dampening 0, got momentum {} and dampening {}", options.momentum,
          options.dampening);
}

std::vector<std::string> sgd::state_names() const {
  if (options_.momentum == 0.0)
    return {};
  return {"momentum_buffer"};
}

void sgd::update(std::size_t, variable& parameter, const tensor& grad, std::vector<tensor>& state) {
  const auto& o = options_;
  tensor data = parameter.data();
  const bool first = o.momentum != 0.0 && state.empty();
  if (first)
    state.push_back(tensor::zeros(data.shape(), data.type(), data.where()));
  tensor none;
  // One pass on the parameter's device (the CPU's: tensor/src/cpu_optim.cpp).
  backend_for(data.where(), "sgd")
    .sgd_step(data, grad, o.momentum != 0.0 ? state[0] : none,
              sgd_step_args{o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, first});
}

} // namespace troupe::optim
