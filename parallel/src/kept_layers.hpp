#pragma once
// A process that hosts a pipeline stage builds the whole model from its
// factory (its layers' names and sizes come from there) but keeps only the
// stage's layers: those are the only ones given values (deferred_init.hpp),
// so the others take neither memory nor drawing time.
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include "troupe/autograd/nn/fwd.hpp"

namespace troupe::parallel {

/// Layers [begin, end) of a model.
struct layer_range {
  std::size_t begin = 0;
  std::size_t end = 0;
};

/// A model of which this process keeps a slice.
struct kept_layers {
  /// Every layer; those outside `kept` hold zeros that take no memory.
  std::shared_ptr<nn::sequential> whole;
  /// The kept layers, with values; they keep their names in `whole`.
  std::shared_ptr<nn::sequential> kept;
};

/// Builds a model with `build` under nn::deferred_init, asks `choose` which
/// layers this process keeps (the whole model is built by then, so the
/// range may depend on its size), and gives values to that slice only.
/// Throws usage_error, prefixed with `who`, when `build` gives no layers or
/// the range does not fit.
kept_layers build_kept_layers(const std::function<std::shared_ptr<nn::sequential>()>& build,
                              const std::function<layer_range(const nn::sequential&)>& choose, std::string_view who);

} // namespace troupe::parallel
