#include "troupe/autograd/optim/sgd.hpp"

#include "kernels.hpp"
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
  if (!detail::on_host(data)) {
    const bool first = o.momentum != 0.0 && state.empty();
    if (first)
      state.push_back(tensor::zeros(data.shape(), data.type(), data.where()));
    tensor none;
    backend_for(data.where(), "sgd")
      .sgd_step(data, grad, o.momentum != 0.0 ? state[0] : none,
                sgd_step_args{o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, first});
    return;
  }
  // Arithmetic in the parameter's own type with the hyper-parameters hoisted
  // into locals, as torch.optim.SGD does: the loop vectorises and the update
  // stays memory-bound.
  if (o.momentum == 0.0) {
    detail::for_floating(data, [&](std::int64_t n, auto* p, const auto* g) {
      using T = std::remove_pointer_t<decltype(p)>;
      const T lr = static_cast<T>(o.lr);
      const T decay = static_cast<T>(o.weight_decay);
      if (decay == T(0)) {
        for (std::int64_t i = 0; i < n; ++i)
          p[i] -= lr * g[i];
      } else {
        for (std::int64_t i = 0; i < n; ++i)
          p[i] -= lr * (g[i] + decay * p[i]);
      }
    }, grad);
    return;
  }
  bool first = state.empty();
  if (first)
    state.push_back(tensor::zeros(data.shape(), data.type(), data.where()));
  detail::for_floating(data, [&](std::int64_t n, auto* p, const auto* g, auto* buf) {
    using T = std::remove_pointer_t<decltype(p)>;
    const T lr = static_cast<T>(o.lr);
    const T decay = static_cast<T>(o.weight_decay);
    const T momentum = static_cast<T>(o.momentum);
    const T keep = static_cast<T>(1.0 - o.dampening);
    const bool nesterov = o.nesterov;
    for (std::int64_t i = 0; i < n; ++i) {
      T d = g[i] + decay * p[i];
      T b = first ? d : momentum * buf[i] + keep * d;
      buf[i] = b;
      p[i] -= lr * (nesterov ? d + momentum * b : b);
    }
  }, grad, state[0]);
}

} // namespace troupe::optim
