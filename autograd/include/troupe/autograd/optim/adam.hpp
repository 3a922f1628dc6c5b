#pragma once
// Adam and AdamW (PyTorch's torch.optim.Adam / AdamW, without amsgrad).
#include "troupe/autograd/optim/optimizer.hpp"

namespace troupe::optim {

struct adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// Adam: L2 penalty added to the gradient. AdamW: decoupled decay
  /// (p *= 1 - lr * weight_decay before the Adam update).
  double weight_decay = 0.0;
};

/// Per element, at the parameter's step t (1, 2, ...):
///   g += weight_decay * p                       (Adam only)
///   p *= 1 - lr * weight_decay                  (AdamW only)
///   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
///   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// State: `<param>.exp_avg`, `<param>.exp_avg_sq`, `<param>.step` (int64).
class adam : public optimizer {
public:
  explicit adam(named_variables parameters, const adam_options& options = {});

  double learning_rate() const override { return options_.lr; }
  void set_learning_rate(double lr) override { options_.lr = lr; }
  const adam_options& options() const noexcept { return options_; }

protected:
  /// For AdamW.
  adam(named_variables parameters, const adam_options& options, bool decoupled_weight_decay);

  std::vector<std::string> state_names() const override;
  std::vector<std::string> scalar_state_names() const override;
  void update(std::size_t index, variable& parameter, const tensor& grad,
              std::vector<tensor>& state) override;

private:
  adam_options options_;
  bool decoupled_;
};

/// AdamW's defaults differ from Adam's only in weight decay (0.01).
inline adam_options adamw_defaults() {
  adam_options options;
  options.weight_decay = 0.01;
  return options;
}

/// Adam with decoupled weight decay (Loshchilov & Hutter).
class adamw : public adam {
public:
  explicit adamw(named_variables parameters, const adam_options& options = adamw_defaults())
    : adam(std::move(parameters), options, true) {}
};

} // namespace troupe::optim
