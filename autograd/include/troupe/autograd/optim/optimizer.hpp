#pragma once
// The base of the optimizers: parameters by name, state by name.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd/variable.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/named_tensors.hpp"

namespace troupe::optim {

using autograd::variable;
using named_variables = std::vector<std::pair<std::string, variable>>;

/// Holds parameters by name (module::named_parameters()) so its state is
/// keyed by name, not by position: `0.weight.momentum_buffer`,
/// `0.weight.exp_avg`, ... A data-parallel replica or pipeline stage saves
/// and restores only its own parameters' entries.
///
/// `step()` runs under no_grad and updates each parameter's data in place;
/// parameters whose grad() is undefined are skipped (and their state does
/// not advance), as in PyTorch. Parameters must be contiguous float32 or
/// float64 on the CPU.
///
/// state_dict: every per-parameter state tensor as `<param>.<state>`, plus
/// `step`, the number of step() calls, as an int64 scalar. Hyper-parameters
/// are not state: they come from the options the optimizer is built with.
class optimizer {
public:
  explicit optimizer(named_variables parameters);
  virtual ~optimizer() = default;
  optimizer(const optimizer&) = delete;
  optimizer& operator=(const optimizer&) = delete;

  /// One update from the current gradients.
  void step();
  /// Drops every parameter's gradient.
  void zero_grad();

  const named_variables& parameters() const noexcept { return parameters_; }
  std::int64_t step_count() const noexcept { return step_count_; }

  /// Snapshot (copies) of the state.
  named_tensors state_dict() const;
  /// The state itself, as state_dict() names it, without copies: valid
  /// until the next step() changes it (a synchronous checkpoint writes it
  /// straight from here).
  named_tensors state_views() const;
  /// Restores state saved by state_dict() of an optimizer of the same kind
  /// over the same parameter names. Outside input: an unknown key, a missing
  /// `step`, a parameter whose state is incomplete, a shape or dtype that
  /// differs are errc::state_mismatch naming the key, and nothing is
  /// modified unless every entry validates. A parameter with no entries has
  /// no state yet (it never had a gradient).
  expected<void> load_state_dict(const named_tensors& state);
  /// The same, keeping the given tensors as the state instead of copies of
  /// them (those already on their parameter's device): for values read to
  /// be loaded, such as a checkpoint's. The caller must not use them after.
  expected<void> load_state_dict(named_tensors&& state);

  /// The learning rate (schedulers change it between steps).
  virtual double learning_rate() const = 0;
  virtual void set_learning_rate(double lr) = 0;

protected:
  /// Names of the per-parameter state tensors, e.g. {"momentum_buffer"}.
  /// Each has the parameter's shape and dtype, except those listed by
  /// scalar_state_names() (int64 scalars).
  virtual std::vector<std::string> state_names() const = 0;
  virtual std::vector<std::string> scalar_state_names() const { return {}; }
  /// Updates parameter `index` (its grad is defined). `state` holds the
  /// parameter's state tensors in state_names() order, then
  /// scalar_state_names(); it is empty on the first update and the
  /// function fills it.
  virtual void update(std::size_t index, variable& parameter, const tensor& grad,
                      std::vector<tensor>& state) = 0;

private:
  /// load_state_dict's checks and loading; `adopt`: keep the tensors
  /// themselves where they can serve as the state.
  expected<void> load_state(const named_tensors& state, bool adopt);

  named_variables parameters_;
  /// Per parameter: empty (no state yet) or all its state tensors.
  std::vector<std::vector<tensor>> state_;
  std::int64_t step_count_ = 0;
};

} // namespace troupe::optim
