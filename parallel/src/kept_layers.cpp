#include "kept_layers.hpp"

#include "troupe/autograd/nn/deferred_init.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

kept_layers build_kept_layers(const std::function<std::shared_ptr<nn::sequential>()>& build,
                              const std::function<layer_range(const nn::sequential&)>& choose, std::string_view who) {
  nn::deferred_init deferred;
  auto whole = build();
  require(whole != nullptr && whole->size() > 0, "{}: the model factory gave no layers", who);
  const auto kept = choose(*whole);
  require(kept.begin < kept.end && kept.end <= whole->size(),
          "{}: layers [{}, {}) but this process's model has {}", who, kept.begin, kept.end, whole->size());
  auto layers = whole->slice(kept.begin, kept.end);
  deferred.materialize(*layers);
  return {std::move(whole), std::move(layers)};
}

} // namespace troupe::parallel
