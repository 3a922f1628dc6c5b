#pragma once
// Distributed autograd (docs/design.md, "Actors and how a training step flows"):
// every tensor that crosses an actor boundary during a training step is
// recorded on both sides under the step's context id, so the gradient can
// travel back along the same edge.
//
//   producer                                 consumer
//   --------                                 --------
//   y = f(x)
//   record_send(key, y)   --- y.data() -->   x' = receive(key, value)   (a leaf requiring grad)
//                                            z = g(x'); ... backward reaches x'
//   backward_sent(key, dx') <-- dx' -------  dx' = take_received_grad(key)
//   (continues backward
//    through f)
//
// Pipelines use it for activations between stages; remote modules and
// parameter-server lookups reuse the same registry. A key is (context id,
// micro-batch, slot): the context id names the training step, the
// micro-batch and slot tell apart the tensors of one step.
//
// Thread model: a registry belongs to one actor and is used from that
// actor's handlers only (no locking).
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "troupe/autograd/variable.hpp"

namespace troupe::parallel {

/// Identifies one tensor crossing an actor boundary within a context.
struct context_key {
  std::uint64_t context_id = 0;
  std::uint32_t micro_batch = 0;
  /// Several tensors of one micro-batch on one edge (0 for a pipeline).
  std::uint32_t slot = 0;

  friend auto operator<=>(const context_key&, const context_key&) = default;
};

/// One actor's record of the tensors it sent and received per context.
class context_registry {
public:
  /// Consumer side: wraps a received tensor as a leaf (requiring a gradient
  /// when `requires_grad`, the usual case for activations) and remembers it
  /// until take_received_grad. Throws usage_error when `key` is already
  /// recorded.
  autograd::variable receive(const context_key& key, tensor value, bool requires_grad = true);

  /// Producer side: remembers `output` (the end of this actor's part of the
  /// graph for `key`) until its gradient comes back. Throws usage_error when
  /// `key` is already recorded.
  void record_send(const context_key& key, autograd::variable output);

  /// Producer side: the consumer's gradient for the tensor sent under `key`
  /// arrived; runs backward from the recorded output with it (accumulating
  /// into this actor's parameters and its own received leaves) and forgets
  /// the output, freeing its graph. Throws usage_error when nothing was sent
  /// under `key` or the shapes differ.
  void backward_sent(const context_key& key, const tensor& grad);

  /// Consumer side: the gradient accumulated in the leaf received under
  /// `key` (zeros when backward did not reach it), and forgets the leaf.
  /// Throws usage_error when nothing was received under `key`.
  tensor take_received_grad(const context_key& key);

  /// Drops a received leaf without a gradient (evaluation, a leaf that
  /// needs none) and the matching sent output, if any.
  void forget(const context_key& key);

  /// Drops everything recorded under `context_id` (a failed step).
  void release_context(std::uint64_t context_id);

  bool holds_sent(const context_key& key) const { return sent_.count(key) != 0; }
  bool holds_received(const context_key& key) const { return received_.count(key) != 0; }
  std::size_t sent_count() const noexcept { return sent_.size(); }
  std::size_t received_count() const noexcept { return received_.size(); }
  bool empty() const noexcept { return sent_.empty() && received_.empty(); }

private:
  std::map<context_key, autograd::variable> sent_;
  std::map<context_key, autograd::variable> received_;
};

} // namespace troupe::parallel
