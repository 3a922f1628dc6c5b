// Activation checkpointing: forward without a graph, recompute in backward.
#include "troupe/autograd/checkpoint.hpp"

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/node.hpp"
#include "troupe/tensor/random.hpp"
#include "pass.hpp"

namespace troupe::autograd {

namespace {

/// Puts the default generator back where it was when this scope began, also
/// when the recomputation throws.
class generator_restore {
public:
  generator_restore() : saved_(default_generator()) {}
  ~generator_restore() { default_generator() = saved_; }
  generator_restore(const generator_restore&) = delete;
  generator_restore& operator=(const generator_restore&) = delete;

private:
  generator saved_;
};

class checkpoint_node final : public node {
public:
  checkpoint_node(checkpoint_function fn, std::vector<variable> inputs, generator state)
      : fn_(std::move(fn)), inputs_(std::move(inputs)), state_(state) {}

  std::vector<tensor> apply(std::vector<tensor> grad_outputs) override {
    require(!released_,
            "backward: {} runs a second time but its saved inputs were freed by the first "
            "backward; pass retain_graph = true to the first backward",
            name());
    // 1. Recompute with the generator as it was at the first run, so dropout
    //    draws the same masks; then put the generator back.
    std::vector<variable> detached;
    detached.reserve(inputs_.size());
    for (const auto& v : inputs_) {
      if (!v.defined()) {
        detached.emplace_back();
        continue;
      }
      auto d = v.detach();
      if (v.requires_grad())
        d.set_requires_grad(true);
      detached.push_back(std::move(d));
    }
    std::vector<variable> outputs;
    {
      generator_restore restore;
      default_generator() = state_;
      grad_mode_guard enable(true);
      outputs = fn_(detached);
    }
    require(outputs.size() == grad_outputs.size(),
            "checkpoint: the function returned {} outputs on recomputation but {} at first",
            outputs.size(), grad_outputs.size());

    // 2. Backward through the recomputed graph from the incoming gradients.
    std::vector<variable> roots;
    std::vector<tensor> grads;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (grad_outputs[i].defined() && outputs[i].requires_grad()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    std::vector<tensor> result(inputs_.size());
    if (roots.empty())
      return result;
    if (pass_scope::accumulating()) {
      // Parameters used inside fn accumulate and fire their hooks here.
      backward(roots, grads);
      for (std::size_t i = 0; i < detached.size(); ++i)
        if (detached[i].defined() && detached[i].requires_grad())
          result[i] = detached[i].grad();
    } else {
      // Inside grad(): leave every leaf's grad() alone.
      std::vector<variable> wanted;
      std::vector<std::size_t> slots;
      for (std::size_t i = 0; i < detached.size(); ++i)
        if (detached[i].defined() && detached[i].requires_grad()) {
          wanted.push_back(detached[i]);
          slots.push_back(i);
        }
      auto g = grad(roots, grads, wanted);
      for (std::size_t k = 0; k < slots.size(); ++k)
        result[slots[k]] = g[k];
    }
    return result;
  }

  std::string name() const override { return "checkpoint_backward"; }

  void release_saved() override {
    inputs_.clear();
    released_ = true;
  }

private:
  checkpoint_function fn_;
  std::vector<variable> inputs_;
  generator state_;
  bool released_ = false;
};

} // namespace

std::vector<variable> checkpoint(const checkpoint_function& fn, const std::vector<variable>& inputs) {
  require(static_cast<bool>(fn), "checkpoint: no function given");
  if (!grad_enabled())
    return fn(inputs);

  const generator state = default_generator();
  std::vector<variable> outputs;
  {
    no_grad_guard no_grad;
    outputs = fn(inputs);
  }

  auto node_ptr = std::make_shared<checkpoint_node>(fn, inputs, state);
  std::vector<edge> edges;
  edges.reserve(inputs.size());
  for (const auto& v : inputs)
    edges.push_back(gradient_edge(v));
  node_ptr->set_next_edges(std::move(edges));
  node_ptr->set_num_inputs(static_cast<std::uint32_t>(outputs.size()));

  std::vector<variable> results;
  results.reserve(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    require(outputs[i].defined(), "checkpoint: output {} of the function is undefined", i);
    require(is_floating(outputs[i].type()),
            "checkpoint: output {} is {}; only floating outputs can be checkpointed", i,
            outputs[i].type());
    results.push_back(
        variable::make_result(outputs[i].data(), node_ptr, static_cast<std::uint32_t>(i)));
  }
  return results;
}

} // namespace troupe::autograd
