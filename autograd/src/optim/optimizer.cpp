#include "troupe/autograd/optim/optimizer.hpp"

#include <algorithm>
#include <optional>

#include "troupe/autograd/grad_mode.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::optim {

optimizer::optimizer(named_variables parameters) : parameters_(std::move(parameters)) {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const auto& [name, parameter] = parameters_[i];
    require(parameter.defined(), "optimizer: parameter '{}' is undefined", name);
    require(parameter.type() == dtype::float32 || parameter.type() == dtype::float64,
            "optimizer: parameter '{}' is {} but must be float32 or float64", name, parameter.type());
    require(parameter.data().is_contiguous(), "optimizer: parameter '{}' is not contiguous", name);
    for (std::size_t j = 0; j < i; ++j)
      require(parameters_[j].first != name, "optimizer: parameter name '{}' appears twice", name);
  }
  state_.resize(parameters_.size());
}

void optimizer::step() {
  autograd::no_grad_guard no_grad;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    auto& [name, parameter] = parameters_[i];
    auto grad = parameter.grad();
    if (!grad.defined())
      continue;
    require(grad.shape() == parameter.shape(), "optimizer: gradient of '{}' is {} but the parameter is {}", name,
            grad.shape(), parameter.shape());
    // set_data may have swapped the storage since construction.
    require(parameter.data().is_contiguous(), "optimizer: parameter '{}' is no longer contiguous", name);
    // CPU parameters are updated by element loops, others (CUDA) by tensor
    // ops on their own device; the gradient is brought to the parameter.
    update(i, parameter, grad.to(parameter.type()).to(parameter.data().where()).contiguous(), state_[i]);
  }
  ++step_count_;
}

void optimizer::zero_grad() {
  for (auto& [name, parameter] : parameters_)
    parameter.zero_grad();
}

named_tensors optimizer::state_dict() const {
  auto out = state_views();
  for (auto& [name, value] : out)
    value = value.clone();
  return out;
}

named_tensors optimizer::state_views() const {
  named_tensors out;
  auto names = state_names();
  auto scalars = scalar_state_names();
  names.insert(names.end(), scalars.begin(), scalars.end());
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    for (std::size_t s = 0; s < state_[i].size(); ++s)
      out.emplace_back(parameters_[i].first + "." + names[s], state_[i][s]);
  out.emplace_back("step", tensor::scalar(static_cast<double>(step_count_), dtype::int64));
  return out;
}

expected<void> optimizer::load_state_dict(const named_tensors& state) { return load_state(state, false); }

expected<void> optimizer::load_state_dict(named_tensors&& state) { return load_state(state, true); }

expected<void> optimizer::load_state(const named_tensors& state, bool adopt) {
  auto tensor_names = state_names();
  auto scalar_names = scalar_state_names();
  auto all_names = tensor_names;
  all_names.insert(all_names.end(), scalar_names.begin(), scalar_names.end());

  // Every key must be `step` or `<known parameter>.<known state>`.
  std::optional<std::int64_t> steps;
  for (std::size_t k = 0; k < state.size(); ++k) {
    const auto& [key, value] = state[k];
    for (std::size_t j = 0; j < k; ++j)
      if (state[j].first == key)
        return make_error(errc::state_mismatch, "optimizer load_state_dict: duplicate key '{}'", key);
    if (!value.defined())
      return make_error(errc::state_mismatch, "optimizer load_state_dict: '{}' is an undefined tensor", key);
    if (key == "step") {
      if (value.numel() != 1 || value.type() != dtype::int64 || value.item() < 0)
        return make_error(errc::state_mismatch,
                          "optimizer load_state_dict: 'step' must be a non-negative int64 scalar, got {} {}",
                          value.type(), value.shape());
      steps = static_cast<std::int64_t>(value.item());
      continue;
    }
    bool known = false;
    for (const auto& [name, parameter] : parameters_)
      for (const auto& s : all_names)
        known = known || key == name + "." + s;
    if (!known)
      return make_error(errc::state_mismatch, "optimizer load_state_dict: unexpected key '{}' (shape {})", key,
                        value.shape());
  }
  if (!steps)
    return make_error(errc::state_mismatch, "optimizer load_state_dict: missing key 'step'");

  // Per parameter: no entries (no state yet) or all of them, shaped right.
  std::vector<std::vector<tensor>> loaded(parameters_.size());
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const auto& [name, parameter] = parameters_[i];
    std::size_t present = 0;
    for (const auto& s : all_names)
      present += find_tensor(state, name + "." + s).defined() ? 1 : 0;
    if (present == 0)
      continue;
    for (std::size_t s = 0; s < all_names.size(); ++s) {
      auto key = name + "." + all_names[s];
      auto value = find_tensor(state, key);
      if (!value.defined())
        return make_error(errc::state_mismatch, "optimizer load_state_dict: missing key '{}'", key);
      bool scalar = s >= tensor_names.size();
      dims want_shape = scalar ? dims{} : parameter.shape();
      dtype want_type = scalar ? dtype::int64 : parameter.type();
      if (scalar ? value.numel() != 1 : value.shape() != want_shape)
        return make_error(errc::state_mismatch,
                          "optimizer load_state_dict: shape mismatch for '{}': state has {} but expected {}", key,
                          value.shape(), want_shape);
      if (value.type() != want_type)
        return make_error(errc::state_mismatch,
                          "optimizer load_state_dict: dtype mismatch for '{}': state has {} but expected {}", key,
                          value.type(), want_type);
      // Moments live where the parameter lives; scalars stay on the host. An
      // adopted tensor is kept when it is a whole contiguous buffer (it was
      // read for this); a copy to the parameter's device is a fresh tensor.
      if (scalar) {
        loaded[i].push_back(value.reshape({}).clone());
        continue;
      }
      auto placed = value.to(parameter.data().where());
      const bool keep = adopt && placed.is_contiguous() && placed.offset() == 0 &&
                        placed.memory()->bytes() == placed.nbytes();
      loaded[i].push_back(keep ? placed : placed.clone());
    }
  }
  state_ = std::move(loaded);
  step_count_ = *steps;
  return {};
}

} // namespace troupe::optim
