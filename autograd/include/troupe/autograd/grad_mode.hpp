#pragma once
// Turning graph recording off (no_grad) for evaluation and optimizer steps.

namespace troupe::autograd {

/// True when ops record a graph (per thread; default true).
bool grad_enabled() noexcept;
void set_grad_enabled(bool enabled) noexcept;

/// RAII scope with graph recording off (torch.no_grad()).
class no_grad_guard {
public:
  no_grad_guard() noexcept : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~no_grad_guard() { set_grad_enabled(previous_); }
  no_grad_guard(const no_grad_guard&) = delete;
  no_grad_guard& operator=(const no_grad_guard&) = delete;

private:
  bool previous_;
};

/// RAII scope that turns recording on or off and restores it afterwards.
class grad_mode_guard {
public:
  explicit grad_mode_guard(bool enabled) noexcept : previous_(grad_enabled()) {
    set_grad_enabled(enabled);
  }
  ~grad_mode_guard() { set_grad_enabled(previous_); }
  grad_mode_guard(const grad_mode_guard&) = delete;
  grad_mode_guard& operator=(const grad_mode_guard&) = delete;

private:
  bool previous_;
};

} // namespace troupe::autograd
