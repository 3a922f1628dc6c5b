// The per-actor registry of tensors sent and received under a context id.
#include "troupe/parallel/distributed_autograd.hpp"

#include <fmt/format.h>

#include "troupe/autograd/backward.hpp"

namespace troupe::parallel {

namespace {

std::string describe(const context_key& key) {
  return fmt::format("context {} micro-batch {} slot {}", key.context_id, key.micro_batch,
                     key.slot);
}

template <class Map>
void erase_context(Map& map, std::uint64_t context_id) {
  auto first = map.lower_bound(context_key{context_id, 0, 0});
  auto last = first;
  while (last != map.end() && last->first.context_id == context_id)
    ++last;
  map.erase(first, last);
}

} // namespace

autograd::variable context_registry::receive(const context_key& key, tensor value,
                                             bool requires_grad) {
  require(received_.count(key) == 0, "distributed autograd: {} was already received",
          describe(key));
  const bool wants_grad = requires_grad && is_floating(value.type());
  autograd::variable leaf(std::move(value), wants_grad);
  received_.emplace(key, leaf);
  return leaf;
}

void context_registry::record_send(const context_key& key, autograd::variable output) {
  require(sent_.count(key) == 0, "distributed autograd: {} was already sent", describe(key));
  sent_.emplace(key, std::move(output));
}

void context_registry::backward_sent(const context_key& key, const tensor& grad) {
  auto it = sent_.find(key);
  require(it != sent_.end(), "distributed autograd: a gradient arrived for {} but nothing was sent",
          describe(key));
  auto output = std::move(it->second);
  sent_.erase(it);
  require(grad.shape() == output.shape(),
          "distributed autograd: the gradient for {} is shaped {} but the output was {}",
          describe(key), grad.shape(), output.shape());
  if (!output.requires_grad())
    return; // nothing upstream of this output needs a gradient
  autograd::variable roots[] = {output};
  tensor grads[] = {grad};
  autograd::backward(roots, grads);
}

tensor context_registry::take_received_grad(const context_key& key) {
  auto it = received_.find(key);
  require(it != received_.end(), "distributed autograd: no tensor was received for {}",
          describe(key));
  auto leaf = std::move(it->second);
  received_.erase(it);
  auto grad = leaf.grad();
  return grad.defined() ? grad : tensor::zeros(leaf.shape(), leaf.type());
}

void context_registry::forget(const context_key& key) {
  sent_.erase(key);
  received_.erase(key);
}

void context_registry::release_context(std::uint64_t context_id) {
  erase_context(sent_, context_id);
  erase_context(received_, context_id);
}

} // namespace troupe::parallel
