#pragma once
// The graph that backward walks: nodes (one per recorded op, one accumulator
// per leaf) joined by edges that point from an op's output gradient towards
// its inputs. Custom differentiable ops (a pipeline's send node, a remote
// lookup) derive from `node` and wire themselves with `gradient_edge` and
// `variable::make_result`.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd/variable.hpp"

namespace troupe::autograd {

/// Where the gradient of one input of an op goes: the input's producer and
/// which of that producer's outputs the input was. An edge with no node means
/// "this input needs no gradient" (a constant, an undefined bias).
struct edge {
  std::shared_ptr<node> fn;
  std::uint32_t input_nr = 0;

  bool valid() const noexcept { return fn != nullptr; }
};

/// A step of backward. `apply` receives dL/d(output i) for each output of the
/// forward op (undefined where no gradient arrived; backward does not call a
/// node whose gradients are all undefined) and returns dL/d(input j) for each
/// next edge j (undefined for "no gradient").
class node {
public:
  /// Sequence number of accumulators: they run as soon as they are ready.
  static constexpr std::uint64_t max_sequence_nr = std::numeric_limits<std::uint64_t>::max();

  node();
  explicit node(std::uint64_t sequence_nr) noexcept : sequence_nr_(sequence_nr) {}
  /// Releases long chains of predecessors iteratively, not recursively.
  virtual ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  virtual std::vector<tensor> apply(std::vector<tensor> grad_outputs) = 0;
  /// For error messages and traces, for example "mul_backward".
  virtual std::string name() const = 0;
  /// Frees what forward saved for backward (after a backward without
  /// retain_graph). Running `apply` afterwards throws usage_error.
  virtual void release_saved() {}

  const std::vector<edge>& next_edges() const noexcept { return next_edges_; }
  void set_next_edges(std::vector<edge> edges) { next_edges_ = std::move(edges); }
  /// Number of gradients `apply` receives (outputs of the forward op).
  std::uint32_t num_inputs() const noexcept { return num_inputs_; }
  void set_num_inputs(std::uint32_t n) noexcept { num_inputs_ = n; }
  /// Creation order: among nodes ready at the same time the most recently
  /// created runs first, so gradients become ready in reverse order of use.
  std::uint64_t sequence_nr() const noexcept { return sequence_nr_; }

private:
  std::vector<edge> next_edges_;
  std::uint32_t num_inputs_ = 1;
  std::uint64_t sequence_nr_;
};

/// Everything behind a variable handle. Internal to autograd; exposed so that
/// custom nodes can be written outside this module.
struct variable_impl {
  tensor data;
  tensor grad;
  bool requires_grad = false;
  std::shared_ptr<node> grad_fn;  // null for leaves
  std::uint32_t output_nr = 0;    // which output of grad_fn this is
  std::weak_ptr<node> grad_accumulator; // leaves: the one accumulator, while a graph holds it
  std::vector<std::pair<std::size_t, variable::grad_ready_hook>> hooks;
  std::size_t next_hook_id = 1;
  std::string name;
};

/// The leaf's accumulator: adds incoming gradients into `grad()` and then
/// fires the leaf's grad-ready hooks. Holds its leaf strongly; the leaf holds
/// it weakly, so the graphs that use a leaf share one accumulator.
class accumulate_grad final : public node {
public:
  explicit accumulate_grad(std::shared_ptr<variable_impl> leaf)
      : node(max_sequence_nr), leaf_(std::move(leaf)) {
    set_next_edges({});
  }
  std::vector<tensor> apply(std::vector<tensor> grad_outputs) override;
  /// As apply({a x b}), but a gradient already there is added to by the
  /// GEMM itself (beta = 1): no product tensor, no second pass over it.
  /// Deferred weight gradients arrive this way, a piece at a time.
  void accumulate_product(const tensor& a, const tensor& b);
  std::string name() const override;
  const std::shared_ptr<variable_impl>& leaf() const noexcept { return leaf_; }

private:
  void run_hooks();
  std::shared_ptr<variable_impl> leaf_;
};

/// The accumulator of a leaf that requires a gradient (created on first use).
std::shared_ptr<node> grad_accumulator(const variable& leaf);

/// The edge along which a gradient for `v` travels: its producer for a
/// non-leaf, its accumulator for a leaf requiring a gradient, an invalid edge
/// otherwise (also for an undefined variable).
edge gradient_edge(const variable& v);

/// True when an op on `inputs` must record a node (grad mode on and some
/// input requires a gradient).
bool any_requires_grad(const std::vector<variable>& inputs);

} // namespace troupe::autograd
