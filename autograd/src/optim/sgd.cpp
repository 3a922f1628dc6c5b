#include "troupe/autograd/optim/sgd.hpp"

#include "kernels.hpp"
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
  if (o.momentum == 0.0) {
    detail::for_floating(data, [&](std::int64_t n, auto* p, const auto* g) {
      for (std::int64_t i = 0; i < n; ++i) {
        double d = static_cast<double>(g[i]) + o.weight_decay * static_cast<double>(p[i]);
        p[i] = static_cast<std::remove_pointer_t<decltype(p)>>(p[i] - o.lr * d);
      }
    }, grad);
    return;
  }
  bool first = state.empty();
  if (first)
    state.push_back(tensor::zeros(data.shape(), data.type()));
  detail::for_floating(data, [&](std::int64_t n, auto* p, const auto* g, auto* buf) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (std::int64_t i = 0; i < n; ++i) {
      double d = static_cast<double>(g[i]) + o.weight_decay * static_cast<double>(p[i]);
      double b = first ? d : o.momentum * buf[i] + (1.0 - o.dampening) * d;
      buf[i] = static_cast<T>(b);
      d = o.nesterov ? d + o.momentum * b : b;
      p[i] = static_cast<T>(p[i] - o.lr * d);
    }
  }, grad, state[0]);
}

} // namespace troupe::optim
