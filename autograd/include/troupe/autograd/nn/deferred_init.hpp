#pragma once
// Building a model of which this process keeps a part: a pipeline stage
// keeps a few layers of the model its factory builds (pipeline.hpp,
// tensor_parallel_pipeline.hpp).
// From tests/autograd/deferred_init_test.cpp:
//
//   deferred_init deferred;
//   auto lazy = std::make_shared<gpt>(small_gpt());
//   ...
//   auto kept = lazy->slice(1, 3); // blocks 0 and 1
//   const auto made = deferred.materialize(*kept);
//
// While a deferred_init is alive, reset_parameters() on this thread records
// each parameter's draw (its seed and fully qualified name) instead of
// making it, and the parameter keeps the zeros its layer made it with.
// Those zeros take no memory until written (tensor::zeros), so the layers
// that are dropped never hold any, and no time goes into drawing them.
// materialize(part) makes the recorded draws of part's parameters: since a
// value depends only on the seed and the name (module.hpp), they equal the
// eager build's.
//
// A parameter that load_state_dict() writes while deferred keeps what was
// loaded (its draw is dropped). A value written by other means before
// materialize() is overwritten by the draw.
#include <cstddef>
#include <functional>
#include <unordered_map>

#include "troupe/autograd/nn/fwd.hpp"

namespace troupe::nn {

class deferred_init {
public:
  /// Defers this thread's draws until destruction (nesting: the innermost
  /// records).
  deferred_init();
  /// Stops deferring; the draws not materialized are dropped, and their
  /// parameters keep zeros.
  ~deferred_init();
  deferred_init(const deferred_init&) = delete;
  deferred_init& operator=(const deferred_init&) = delete;

  /// Makes the recorded draws of `part`'s parameters (once each); returns
  /// how many it made.
  std::size_t materialize(const module& part);
  /// Draws recorded and not yet made.
  std::size_t pending() const noexcept { return draws_.size(); }
  /// The innermost deferred_init alive on this thread, or nullptr: what
  /// keeps a part of a model built under it materializes that part.
  static deferred_init* current() noexcept;

private:
  friend class module; // records and drops draws
  /// Keyed by the parameter's data address: a later draw of the same
  /// parameter (an enclosing module's reset_parameters) replaces it.
  void record(const void* parameter, std::function<void()> draw);
  void drop(const void* parameter) { draws_.erase(parameter); }

  std::unordered_map<const void*, std::function<void()>> draws_;
  deferred_init* previous_;
};

} // namespace troupe::nn
