#include "troupe/autograd/nn/sequential.hpp"

#include <string>

namespace troupe::nn {

sequential::sequential(std::initializer_list<module_ptr> layers) {
  for (const auto& layer : layers)
    append(layer);
}

sequential::sequential(const std::vector<module_ptr>& layers) {
  for (const auto& layer : layers)
    append(layer);
}

variable sequential::forward(const variable& input) {
  variable x = input;
  for (const auto& layer : layers_)
    x = layer->forward(x);
  return x;
}

void sequential::append(module_ptr layer) {
  append_named(std::to_string(next_index_), std::move(layer), false);
}

void sequential::append_named(std::string name, module_ptr layer, bool shared) {
  require(layer != nullptr, "sequential::append: layer {} is null", name);
  next_index_ = std::stoll(name) + 1;
  names_.push_back(name);
  layers_.push_back(layer);
  if (shared)
    register_shared_module(std::move(name), std::move(layer));
  else
    register_module(std::move(name), std::move(layer));
}

const module_ptr& sequential::at(std::size_t i) const {
  require(i < layers_.size(), "sequential::at: index {} but size is {}", i, layers_.size());
  return layers_[i];
}

const std::string& sequential::name_at(std::size_t i) const {
  require(i < names_.size(), "sequential::name_at: index {} but size is {}", i, names_.size());
  return names_[i];
}

std::shared_ptr<sequential> sequential::slice(std::size_t begin, std::size_t end) const {
  require(begin <= end && end <= layers_.size(), "sequential::slice: [{}, {}) is not within [0, {}]", begin, end,
          layers_.size());
  auto out = std::make_shared<sequential>();
  for (auto i = begin; i < end; ++i)
    out->append_named(names_[i], layers_[i], true);
  // train() would propagate into the shared layers; the flag alone suffices.
  out->set_training_flag(is_training());
  return out;
}

} // namespace troupe::nn
