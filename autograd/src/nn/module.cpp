// Module bookkeeping: registration, fully qualified names, state dicts,
// seeded initialisation by name.
#include "troupe/autograd/nn/module.hpp"

#include <algorithm>

#include "troupe/autograd/nn/deferred_init.hpp"

#include "troupe/tensor/error.hpp"

namespace troupe::nn {

std::string join_name(const std::string& prefix, const std::string& name) {
  if (prefix.empty())
    return name;
  return prefix + "." + name;
}

void module::check_new_name(const std::string& name, const char* what) const {
  require(!name.empty(), "{}: empty name", what);
  require(name.find('.') == std::string::npos, "{}: name '{}' contains a dot", what, name);
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& entry) { return entry.first == name; });
  };
  require(!taken(parameters_) && !taken(buffers_) && !taken(children_), "{}: name '{}' is already registered",
          what, name);
}

variable& module::register_parameter(std::string name, variable parameter) {
  check_new_name(name, "register_parameter");
  require(parameter.defined(), "register_parameter: '{}' is undefined", name);
  require(parameter.is_leaf(), "register_parameter: '{}' is not a leaf variable", name);
  parameter.set_requires_grad(true);
  parameter.set_name(join_name(prefix(), name));
  parameters_.emplace_back(std::move(name), std::move(parameter));
  return parameters_.back().second;
}

tensor& module::register_buffer(std::string name, tensor buffer) {
  check_new_name(name, "register_buffer");
  require(buffer.defined(), "register_buffer: '{}' is undefined", name);
  buffers_.emplace_back(std::move(name), std::move(buffer));
  return buffers_.back().second;
}

void module::register_shared_module(std::string name, module_ptr child) {
  register_module_impl(std::move(name), std::move(child), false);
}

void module::register_module_impl(std::string name, module_ptr child, bool rename) {
  check_new_name(name, "register_module");
  require(child != nullptr, "register_module: '{}' is null", name);
  require(child.get() != this, "register_module: '{}' is the module itself", name);
  // Variables carry their name under the newest parent; assembled bottom-up,
  // that is the FQN in the whole model.
  // A module that already has a parent is shared (weight tying, a second
  // container over existing layers): it keeps its first parent and names.
  if (rename && child->parent_ == nullptr) {
    child->parent_ = this;
    child->name_in_parent_ = name;
    child->rename_parameters(join_name(prefix(), name));
  }
  children_.emplace_back(std::move(name), std::move(child));
}

module::~module() {
  for (auto& [name, child] : children_)
    if (child->parent_ == this)
      child->parent_ = nullptr;
}

std::string module::prefix() const {
  std::string out;
  for (const module* m = this; m->parent_ != nullptr; m = m->parent_)
    out = out.empty() ? m->name_in_parent_ : m->name_in_parent_ + "." + out;
  return out;
}

void module::rename_parameters(const std::string& prefix) {
  for (auto& [fqn, parameter] : named_parameters())
    parameter.set_name(join_name(prefix, fqn));
}

void module::collect_parameters(const std::string& prefix, named_variables& out) const {
  for (const auto& [name, parameter] : parameters_)
    out.emplace_back(join_name(prefix, name), parameter);
  for (const auto& [name, child] : children_)
    child->collect_parameters(join_name(prefix, name), out);
}

void module::collect_buffers(const std::string& prefix, named_tensors& out) const {
  for (const auto& [name, buffer] : buffers_)
    out.emplace_back(join_name(prefix, name), buffer);
  for (const auto& [name, child] : children_)
    child->collect_buffers(join_name(prefix, name), out);
}

void module::collect_modules(const std::string& prefix,
                             std::vector<std::pair<std::string, module*>>& out) {
  out.emplace_back(prefix, this);
  for (const auto& [name, child] : children_)
    child->collect_modules(join_name(prefix, name), out);
}

named_variables module::named_parameters() const {
  named_variables out;
  collect_parameters("", out);
  return out;
}

std::vector<variable> module::parameters() const {
  std::vector<variable> out;
  for (auto& [name, parameter] : named_parameters())
    out.push_back(std::move(parameter));
  return out;
}

named_tensors module::named_buffers() const {
  named_tensors out;
  collect_buffers("", out);
  return out;
}

std::vector<std::pair<std::string, module_ptr>> module::named_children() const {
  return children_;
}

std::vector<module_ptr> module::children() const {
  std::vector<module_ptr> out;
  for (const auto& [name, child] : children_)
    out.push_back(child);
  return out;
}

std::vector<std::pair<std::string, module*>> module::named_modules() {
  std::vector<std::pair<std::string, module*>> out;
  collect_modules("", out);
  return out;
}

std::int64_t module::parameter_count() const {
  std::int64_t count = 0;
  for (const auto& [name, parameter] : named_parameters())
    count += parameter.numel();
  return count;
}

named_tensors module::state_dict() const {
  // Per module, parameters before buffers; modules depth first.
  named_tensors out;
  collect_state("", out);
  return out;
}

void module::collect_state(const std::string& prefix, named_tensors& out) const {
  for (const auto& [name, parameter] : parameters_)
    out.emplace_back(join_name(prefix, name), parameter.data());
  for (const auto& [name, buffer] : buffers_)
    out.emplace_back(join_name(prefix, name), buffer);
  for (const auto& [name, child] : children_)
    child->collect_state(join_name(prefix, name), out);
}

expected<void> module::load_state_dict(const named_tensors& state, bool strict) {
  // Validate everything first; copy only when all of it fits.
  auto own = state_dict();
  std::vector<std::pair<tensor, tensor>> copies; // destination, source
  copies.reserve(own.size());
  for (const auto& [key, destination] : own) {
    auto found = std::find_if(state.begin(), state.end(), [&](const auto& e) { return e.first == key; });
    if (found == state.end()) {
      if (strict)
        return make_error(errc::state_mismatch, "load_state_dict: missing key '{}' (shape {})", key,
                          destination.shape());
      continue;
    }
    const auto& source = found->second;
    if (!source.defined())
      return make_error(errc::state_mismatch, "load_state_dict: '{}' is an undefined tensor", key);
    if (source.shape() != destination.shape())
      return make_error(errc::state_mismatch,
                        "load_state_dict: shape mismatch for '{}': state has {} but the model has {}", key,
                        source.shape(), destination.shape());
    if (source.type() != destination.type())
      return make_error(errc::state_mismatch,
                        "load_state_dict: dtype mismatch for '{}': state has {} but the model has {}", key,
                        source.type(), destination.type());
    copies.emplace_back(destination, source);
  }
  for (std::size_t i = 0; i < state.size(); ++i) {
    const auto& key = state[i].first;
    bool known = std::any_of(own.begin(), own.end(), [&](const auto& e) { return e.first == key; });
    if (!known && strict)
      return make_error(errc::state_mismatch, "load_state_dict: unexpected key '{}' (shape {})", key,
                        state[i].second.defined() ? state[i].second.shape() : dims{});
    for (std::size_t j = 0; j < i; ++j)
      if (state[j].first == key)
        return make_error(errc::state_mismatch, "load_state_dict: duplicate key '{}'", key);
  }
  auto* deferred = deferred_init::current();
  for (auto& [destination, source] : copies) {
    if (deferred != nullptr)
      deferred->drop(destination.raw_data()); // loaded, not drawn
    if (destination.where() != source.where()) // a host checkpoint into a model on a GPU, or back
      destination.copy_from(source.to(destination.where()));
    else if (!destination.shares_storage_with(source) || destination.offset() != source.offset())
      destination.copy_from(source);
  }
  return {};
}

void module::init_parameter(const std::string&, tensor&, generator&) {}

void module::reset_with_prefix(std::uint64_t seed, const std::string& prefix) {
  auto* deferred = deferred_init::current();
  for (auto& [name, parameter] : parameters_) {
    auto draw = [this, name, fqn = join_name(prefix, name), seed] {
      auto gen = generator{seed, 0}.fork(stable_hash(fqn.data(), fqn.size()));
      for (auto& [own, p] : parameters_)
        if (own == name) {
          tensor data = p.data();
          init_parameter(name, data, gen);
        }
    };
    if (deferred != nullptr)
      deferred->record(parameter.data().raw_data(), std::move(draw));
    else
      draw();
  }
  for (auto& [name, child] : children_)
    child->reset_with_prefix(seed, join_name(prefix, name));
}

// -- deferred_init.hpp ---------------------------------------------------------------------------

namespace {
thread_local deferred_init* innermost_deferred = nullptr;
} // namespace

deferred_init::deferred_init() : previous_(innermost_deferred) { innermost_deferred = this; }

deferred_init::~deferred_init() { innermost_deferred = previous_; }

deferred_init* deferred_init::current() noexcept { return innermost_deferred; }

void deferred_init::record(const void* parameter, std::function<void()> draw) {
  draws_.insert_or_assign(parameter, std::move(draw));
}

std::size_t deferred_init::materialize(const module& part) {
  std::size_t made = 0;
  for (const auto& [name, parameter] : part.named_parameters()) {
    auto found = draws_.find(parameter.data().raw_data());
    if (found == draws_.end())
      continue;
    auto draw = std::move(found->second);
    draws_.erase(found);
    draw();
    ++made;
  }
  return made;
}

void module::reset_parameters(std::uint64_t seed) {
  reset_with_prefix(seed, "");
}

void module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_)
    child->train(on);
}

module& module::to(device where) {
  for (auto& parameter : parameters()) {
    if (parameter.data().where() != where) {
      parameter.set_data(parameter.data().to(where));
      parameter.zero_grad();
    }
  }
  for (auto& [name, child] : named_modules())
    for (auto& [buffer_name, buffer] : child->buffers_)
      if (buffer.where() != where)
        buffer = buffer.to(where);
  return *this;
}

void module::zero_grad() {
  for (auto& parameter : parameters())
    parameter.zero_grad();
}

} // namespace troupe::nn
