#pragma once
// Running reverse-mode differentiation.
#include <span>
#include <vector>

#include "troupe/autograd/variable.hpp"

namespace troupe::autograd {

struct backward_options {
  /// Keep the graph's saved tensors so backward can run through it again.
  bool retain_graph = false;
};

/// Propagates `grads[i]` (dL/d roots[i], same shape) back through the graph
/// and accumulates into every reachable leaf that requires a gradient. Roots
/// may be any variables, not just a scalar loss: a pipeline stage starts from
/// its output and the gradient it received from the next stage.
void backward(std::span<const variable> roots, std::span<const tensor> grads,
              backward_options options = {});

/// backward from a one-element loss with gradient 1.
void backward(const variable& loss, backward_options options = {});

/// Gradients of `outputs` with respect to `inputs` (torch.autograd.grad),
/// without accumulating into any leaf's grad(). Undefined tensors for
/// inputs that are unreachable.
std::vector<tensor> grad(std::span<const variable> outputs, std::span<const tensor> grad_outputs,
                         std::span<const variable> inputs, backward_options options = {});

} // namespace troupe::autograd
