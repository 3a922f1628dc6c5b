#pragma once
// Recomputation (activation checkpointing).
#include <functional>
#include <vector>

#include "troupe/autograd/variable.hpp"

namespace troupe::autograd {

using checkpoint_function = std::function<std::vector<variable>(const std::vector<variable>&)>;

/// Runs `fn(inputs)` without keeping its intermediate activations; during
/// backward, `fn` runs again (with the default generator's state as it was
/// at the first run, so dropout masks replay) and its graph is
/// differentiated. Gradients equal those of calling `fn` directly; the peak
/// memory of a pipeline stage drops to its inputs and outputs.
/// Parameters used inside `fn` receive their gradients (and fire their
/// grad-ready hooks) during that recomputation.
std::vector<variable> checkpoint(const checkpoint_function& fn, const std::vector<variable>& inputs);

} // namespace troupe::autograd
