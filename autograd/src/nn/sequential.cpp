#include "troupe/autograd/nn/sequential.hpp"

#include <string>
#include <typeinfo>
#include <utility>

#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/gelu.hpp"
#include "troupe/autograd/nn/linear.hpp"

namespace troupe::nn {

sequential::sequential(std::initializer_list<module_ptr> layers) {
  for (const auto& layer : layers)
    append(layer);
}

sequential::sequential(const std::vector<module_ptr>& layers) {
  for (const auto& layer : layers)
    append(layer);
}

namespace {

/// The pair at `at`, `at + 1` when it is a linear layer with a bias followed
/// by GELU (exactly those classes: a subclass may compute something else).
std::pair<const linear*, const gelu*> linear_then_gelu(const std::vector<module_ptr>& layers, std::size_t at) {
  if (at + 1 >= layers.size())
    return {};
  const module& first = *layers[at];
  const module& second = *layers[at + 1];
  if (typeid(first) != typeid(linear) || typeid(second) != typeid(gelu))
    return {};
  const auto& fc = static_cast<const linear&>(first);
  if (!fc.bias().defined())
    return {};
  return {&fc, &static_cast<const gelu&>(second)};
}

} // namespace

// Linear then GELU runs as the linear without its bias and one bias_gelu:
// the biased output is neither stored nor read again (functions.hpp). The
// values differ from the two layers' only by float rounding (the bias is
// added after the product instead of before it).
variable sequential::forward(const variable& input) {
  variable x = input;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    if (auto [fc, activation] = linear_then_gelu(layers_, i); fc != nullptr) {
      x = autograd::bias_gelu(autograd::linear(x, fc->weight(), variable()), fc->bias(), activation->approximate());
      ++i;
      continue;
    }
    x = layers_[i]->forward(x);
  }
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
