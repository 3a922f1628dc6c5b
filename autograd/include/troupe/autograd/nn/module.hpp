#pragma once
// The base of every layer: named parameters, buffers and sub-modules.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd/nn/fwd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/named_tensors.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::nn {

using autograd::variable;

/// Name → parameter pairs in a stable order (the order optimizers, data
/// parallel buckets and checkpoints rely on).
using named_variables = std::vector<std::pair<std::string, variable>>;

/// A layer or a composition of layers, held through `std::shared_ptr`
/// (modules are shared: a sequential slice refers to the same sub-modules as
/// the whole model).
///
/// Names. A module's own parameters, buffers and children carry local names
/// ("weight", "0", "attn"); `named_parameters()` joins them into fully
/// qualified names ("layers.3.weight") relative to the module it is called
/// on: own parameters first, then each child's, depth first, in registration
/// order (as torch.nn.Module). Each parameter variable's `name()` is kept
/// equal to its FQN from the root of the tree it is registered in (set by
/// register_parameter and register_module, whether the model is assembled
/// bottom-up or top-down), so traces and error messages name it as the
/// whole model's state_dict does. The first parent a module is registered
/// in owns its names; registering it in another container (a sequential
/// slice, weight tying) shares it without renaming.
///
/// Initialisation. `reset_parameters(seed)` gives the parameter called
/// `fqn` (relative to the module it is called on) the values of the layer's
/// init rule drawn from `generator{seed}.fork(stable_hash(fqn))`, so the
/// values depend only on seed and name — not on creation order, process or
/// which slice of a model a pipeline stage builds.
class module {
public:
  module() = default;
  virtual ~module();
  module(const module&) = delete;
  module& operator=(const module&) = delete;

  // -- computation -----------------------------------------------------------

  /// The layer's computation. Layers that take integer ids (embedding, gpt)
  /// receive them as an int64 tensor wrapped in a variable that does not
  /// require a gradient: `variable(ids)`.
  virtual variable forward(const variable& input) = 0;
  variable operator()(const variable& input) { return forward(input); }

  // -- registration ----------------------------------------------------------

  /// Registers a parameter (marks it as requiring a gradient) and returns it.
  /// Throws usage_error for an empty, dotted or duplicate name.
  variable& register_parameter(std::string name, variable parameter);
  /// Registers non-trainable state that belongs in the state_dict.
  tensor& register_buffer(std::string name, tensor buffer);
  /// Registers a child; its parameters appear as `name.<child fqn>`.
  template <class Module>
  std::shared_ptr<Module> register_module(std::string name, std::shared_ptr<Module> child) {
    register_module_impl(std::move(name), child);
    return child;
  }

  // -- introspection ---------------------------------------------------------

  named_variables named_parameters() const;
  std::vector<variable> parameters() const;
  named_tensors named_buffers() const;
  /// Direct children, in registration order.
  std::vector<std::pair<std::string, module_ptr>> named_children() const;
  std::vector<module_ptr> children() const;
  /// This module (name "") and every descendant with its FQN, depth first
  /// (pointers valid while this module lives).
  std::vector<std::pair<std::string, module*>> named_modules();
  /// Total number of parameter elements.
  std::int64_t parameter_count() const;

  // -- state -------------------------------------------------------------------

  /// Parameters then buffers (each module's own before its children's), by
  /// FQN. The tensors share storage with the module: clone them to snapshot.
  named_tensors state_dict() const;
  /// Copies `state` into the parameters and buffers in place, onto their
  /// device wherever `state` lives (a host checkpoint into a model on a
  /// GPU). State usually
  /// comes from a file, so every problem is an errc::state_mismatch naming
  /// the key (a missing key, an unexpected key when `strict`, a shape or
  /// dtype that differs) — and nothing is modified unless every entry
  /// validates. With `strict == false`, missing and unexpected keys are
  /// ignored but shape and dtype must still match.
  expected<void> load_state_dict(const named_tensors& state, bool strict = true);

  /// Re-initialises every parameter from `seed` by its FQN (see above).
  void reset_parameters(std::uint64_t seed);

  /// Moves every parameter and buffer (this module's and its
  /// descendants') to `where`, in place: the parameter variables stay the
  /// same objects, so optimizers made before or after see the moved values.
  /// Gradients are dropped. Returns *this for chaining.
  module& to(device where);

  // -- mode --------------------------------------------------------------------

  /// Sets training mode on this module and every descendant.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const noexcept { return training_; }

  /// Drops the gradient of every parameter.
  void zero_grad();

protected:
  /// Registers a child that already belongs to another parent (sequential
  /// slices) without renaming its parameter variables.
  void register_shared_module(std::string name, module_ptr child);
  /// Sets this module's flag only (not its children's).
  void set_training_flag(bool on) noexcept { training_ = on; }

  /// The layer's init rule for its own parameter `name` (a local name),
  /// drawing from `gen`. The default leaves the values unchanged.
  virtual void init_parameter(const std::string& name, tensor& data, generator& gen);

private:
  void register_module_impl(std::string name, module_ptr child, bool rename = true);
  void check_new_name(const std::string& name, const char* what) const;
  void collect_parameters(const std::string& prefix, named_variables& out) const;
  void collect_buffers(const std::string& prefix, named_tensors& out) const;
  void collect_state(const std::string& prefix, named_tensors& out) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, module*>>& out);
  void reset_with_prefix(std::uint64_t seed, const std::string& prefix);

  /// This module's FQN prefix from the root (walks the parent chain).
  std::string prefix() const;
  void rename_parameters(const std::string& prefix);

  /// The owning parent (non-owning pointer, cleared when the parent dies).
  module* parent_ = nullptr;
  std::string name_in_parent_;
  named_variables parameters_;
  named_tensors buffers_;
  std::vector<std::pair<std::string, module_ptr>> children_;
  bool training_ = true;
};

/// `std::make_shared<Module>(args...)`, spelled like a factory.
template <class Module, class... Args>
std::shared_ptr<Module> make(Args&&... args) {
  return std::make_shared<Module>(std::forward<Args>(args)...);
}

/// Joins a prefix and a local name with a dot ("" + "weight" = "weight").
std::string join_name(const std::string& prefix, const std::string& name);

} // namespace troupe::nn
