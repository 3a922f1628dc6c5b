#pragma once
// A tensor that takes part in reverse-mode differentiation.
#include <functional>
#include <memory>
#include <string>

#include "troupe/tensor/tensor.hpp"

namespace troupe::autograd {

class node;
struct variable_impl;

/// A value handle over a tensor plus its autograd state: whether it requires
/// a gradient, its accumulated gradient (leaves), and the graph node that
/// produced it (non-leaves). Copies share that state, like torch.Tensor.
///
/// Ops on variables (functions.hpp) record a graph when any input requires a
/// gradient and grad mode is on (see no_grad_guard). The tensor module below
/// knows nothing of this: autograd wraps it.
class variable {
public:
  variable() = default;
  /// A leaf wrapping `data`.
  explicit variable(tensor data, bool requires_grad = false);

  bool defined() const noexcept { return impl_ != nullptr; }
  const tensor& data() const;
  /// Replaces the data in place (optimizers, load_state_dict); the graph
  /// does not see this change.
  void set_data(tensor data);

  bool requires_grad() const;
  /// Only on leaves.
  void set_requires_grad(bool flag);
  bool is_leaf() const;

  /// The accumulated gradient (undefined until a backward reaches this leaf).
  tensor grad() const;
  void set_grad(tensor grad);
  /// Drops the gradient (the next backward starts from zero).
  void zero_grad();

  /// A hook called each time backward has finished accumulating this leaf's
  /// gradient — all contributions of that backward pass are in `grad()`.
  /// Data parallelism starts reducing a bucket from here. Returns an id for
  /// remove_grad_ready_hook.
  using grad_ready_hook = std::function<void(variable&)>;
  std::size_t add_grad_ready_hook(grad_ready_hook hook);
  void remove_grad_ready_hook(std::size_t id);

  /// The node that produced this variable (null for leaves).
  const std::shared_ptr<node>& grad_fn() const;

  /// A new leaf sharing this data, with no history and no gradient.
  variable detach() const;

  /// Optional name (set by nn modules to the fully qualified parameter name;
  /// used in error messages and traces).
  const std::string& name() const;
  void set_name(std::string name);

  // Conveniences forwarding to data().
  const dims& shape() const { return data().shape(); }
  dtype type() const { return data().type(); }
  std::int64_t numel() const { return data().numel(); }
  std::int64_t size(std::int64_t dim) const { return data().size(dim); }
  double item() const { return data().item(); }

  /// Identity: two handles to the same variable.
  bool same(const variable& other) const noexcept { return impl_ == other.impl_; }
  const std::shared_ptr<variable_impl>& impl() const noexcept { return impl_; }

  /// Internal: a non-leaf produced by `fn` (output number `output_index`).
  static variable make_result(tensor data, std::shared_ptr<node> fn, std::uint32_t output_index = 0);
  /// Internal: a handle to existing state (accumulators, hooks).
  static variable from_impl(std::shared_ptr<variable_impl> impl) noexcept;

private:
  std::shared_ptr<variable_impl> impl_;
};

} // namespace troupe::autograd
