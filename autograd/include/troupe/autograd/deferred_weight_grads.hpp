#pragma once
// Deferred weight gradients: the "W" of zero-bubble pipeline schedules
// (Qi et al., 2023) computed once per step instead of once per micro-batch.
//
// A pipeline stage runs backward once per micro-batch. For a linear layer
// that is three products per micro-batch: dx = dy W (needed at once: the
// previous stage waits for it), db, and dW = dy^T x (needed only by the
// optimizer step). With m micro-batches of b/m rows, dW costs m GEMMs with an
// inner dimension of b/m, each writing the whole [out, in] matrix, plus m - 1
// additions into the gradient: on the MLP of bench/pipeline (1024 x 1024,
// batch 256) four micro-batches made a stage's step 1.3x slower than one.
//
// While a `deferral_scope` is active on a thread, linear's backward computes
// dx and db as usual but keeps (dy, x) for the weight instead of computing
// dW. `flush()` then computes each kept weight's gradient as one GEMM over
// all kept rows, dW = [dy_1; ...; dy_m]^T [x_1; ...; x_m], and delivers it to
// the weight exactly as backward would have (accumulated into grad(), grad-
// ready hooks fired), in the order the weights were first deferred. The
// result equals the per-micro-batch sum up to float summation order.
//
// Only weights that are leaves are deferred, and only in backward() (never in
// grad(), which must not touch leaves); anything else is computed at once.
// The kept tensors are the layer's saved input and the incoming gradient,
// per layer and micro-batch, until flush(): memory that plain backward frees
// at once (bytes() says how much). A 1F1B stage that flushes once per step
// therefore holds these for all m micro-batches, not for its credits only.
#include <cstddef>
#include <memory>
#include <vector>

#include "troupe/autograd/node.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::autograd {

class deferred_weight_grads {
public:
  deferred_weight_grads() = default;
  deferred_weight_grads(const deferred_weight_grads&) = delete;
  deferred_weight_grads& operator=(const deferred_weight_grads&) = delete;

  /// Keeps the factors of dW = dy^T x for the leaf behind `accumulator`.
  /// `dy` is [rows, out] and `x` is [rows, in].
  void defer(const std::shared_ptr<node>& accumulator, tensor dy, tensor x);

  /// Computes and delivers every kept weight gradient; afterwards nothing is
  /// kept. Throws what the delivery throws (a grad-ready hook's error).
  void flush();

  /// Computes and delivers the kept gradient of one weight, the first one
  /// deferred, over the rows kept for it so far; false when nothing is kept.
  /// A pipeline stage calls it while it waits for messages, so the weight
  /// gradients fill its idle time (zero-bubble's W filling the bubble);
  /// the weight's later rows are kept again and delivered by a later call
  /// or flush(), accumulating into the same grad(). The sum over the calls
  /// equals flush()'s result up to float summation order.
  bool flush_one();

  /// Forgets what is kept without computing it (a failed step).
  void clear() noexcept {
    pending_.clear();
    bytes_ = 0;
  }

  bool empty() const noexcept { return pending_.empty(); }
  /// Weights with kept factors.
  std::size_t weights() const noexcept { return pending_.size(); }
  /// Bytes of the kept tensors (each counted whole, also when it is a view
  /// another tensor shares): what deferral holds beyond plain backward.
  std::size_t bytes() const noexcept { return bytes_; }

private:
  struct pending_weight {
    std::shared_ptr<node> accumulator;
    std::vector<tensor> dy;
    std::vector<tensor> x;
  };
  /// One GEMM over the weight's kept rows, delivered to its accumulator.
  static void deliver(pending_weight& p);
  std::vector<pending_weight> pending_;
  std::size_t bytes_ = 0;
};

/// Makes `target` the deferral of this thread for the scope's lifetime
/// (scopes nest; the innermost wins).
class deferral_scope {
public:
  explicit deferral_scope(deferred_weight_grads& target) noexcept;
  ~deferral_scope();
  deferral_scope(const deferral_scope&) = delete;
  deferral_scope& operator=(const deferral_scope&) = delete;

  /// The active deferral of this thread, or nullptr.
  static deferred_weight_grads* active() noexcept;

private:
  deferred_weight_grads* previous_;
};

} // namespace troupe::autograd
