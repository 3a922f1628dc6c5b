#pragma once
// A chain of modules, indexable and sliceable so pipelines can partition it.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

/// Runs its children in order. Child i is registered under the name of its
/// index ("0", "1", ...), so parameters read `3.weight` (or
/// `layers.3.weight` when the sequential is registered as `layers`).
///
/// `slice(begin, end)` returns a new sequential that SHARES the sub-modules
/// and keeps their ORIGINAL names: slice [4, 8) of an 8-layer model has
/// state_dict keys `4.weight` .. `7.bias`, exactly the whole model's keys
/// for those layers — a pipeline stage's shard maps back onto the full
/// state_dict, and reset_parameters(seed) on the slice gives the same
/// values as on the whole model.
class sequential : public module {
public:
  sequential() = default;
  sequential(std::initializer_list<module_ptr> layers);
  explicit sequential(const std::vector<module_ptr>& layers);

  variable forward(const variable& input) override;

  /// Adds a layer named after the next index (the last name + 1).
  void append(module_ptr layer);
  /// The i-th layer of this sequential (0-based position, not the name).
  const module_ptr& at(std::size_t i) const;
  module_ptr operator[](std::size_t i) const { return at(i); }
  std::size_t size() const noexcept { return layers_.size(); }
  /// The name layer i is registered under (its index in the original).
  const std::string& name_at(std::size_t i) const;

  /// Layers [begin, end) by position, sharing modules, original names kept.
  /// The slice takes this sequential's training mode.
  std::shared_ptr<sequential> slice(std::size_t begin, std::size_t end) const;

private:
  void append_named(std::string name, module_ptr layer, bool shared);

  std::vector<module_ptr> layers_;
  std::vector<std::string> names_;
  std::int64_t next_index_ = 0;
};

} // namespace troupe::nn
