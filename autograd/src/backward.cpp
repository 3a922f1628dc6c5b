// The backward engine: one synchronous pass over the graph reachable from
// the roots, run on the calling thread. It is re-entrant (a checkpoint node
// runs a nested pass from inside apply).
#include "troupe/autograd/backward.hpp"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "troupe/autograd/grad_mode.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/autograd/node.hpp"
#include "pass.hpp"

namespace troupe::autograd {

namespace {

thread_local bool accumulating_pass = true;

struct node_state {
  std::size_t dependencies = 0;     // incoming edges not yet delivered
  std::vector<tensor> buffer;       // summed incoming gradients, one per output
  bool execute = true;              // false: only walked (grad() pruning)
  std::vector<std::size_t> captures; // grad(): result slots fed from this node
};

struct ready_entry {
  std::uint64_t sequence_nr;
  std::uint64_t order; // ties: first pushed runs first, for determinism
  node* fn;
  bool operator<(const ready_entry& other) const {
    if (sequence_nr != other.sequence_nr)
      return sequence_nr < other.sequence_nr; // largest sequence_nr on top
    return order > other.order;
  }
};

void add_into(tensor& slot, const tensor& g) {
  if (!g.defined())
    return;
  // Out of place: `g` may alias a tensor the caller or another node holds.
  slot = slot.defined() ? troupe::add(slot, g) : g;
}

struct capture_target {
  edge where;
  std::size_t slot;
};

/// Runs one pass. With `captures` empty it accumulates into leaves;
/// otherwise it returns the gradients arriving at the captured edges and
/// touches no leaf.
std::vector<tensor> run_pass(std::span<const variable> roots, std::span<const tensor> grads,
                             const std::vector<capture_target>& captures, std::size_t num_results,
                             bool retain_graph, const char* op) {
  require(roots.size() == grads.size(), "{}: {} roots but {} gradients", op, roots.size(),
          grads.size());
  const bool accumulate = captures.empty();

  // Root edges with their gradients.
  std::vector<std::pair<edge, tensor>> seeds;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    const auto& root = roots[i];
    require(root.defined(), "{}: root {} is undefined", op, i);
    require(root.requires_grad(),
            "{}: root {} ({}) does not require a gradient and has no grad_fn", op, i,
            root.data());
    if (!grads[i].defined())
      continue; // no gradient for this root: it contributes nothing
    require(grads[i].shape() == root.shape(),
            "{}: gradient {} for root {} has shape {} but the root has shape {}", op, i, i,
            grads[i].shape(), root.shape());
    require(grads[i].type() == root.type(),
            "{}: gradient for root {} has dtype {} but the root has dtype {}", op, i,
            grads[i].type(), root.type());
    require(grads[i].where() == root.data().where(),
            "{}: gradient for root {} is on {} but the root is on {}", op, i, grads[i].where(),
            root.data().where());
    seeds.emplace_back(gradient_edge(root), grads[i]);
  }

  // Discover the graph and count each node's incoming edges.
  std::unordered_map<node*, node_state> states;
  std::vector<node*> discovered; // in discovery order
  std::vector<node*> stack;
  auto visit = [&](node* fn) {
    auto [it, fresh] = states.try_emplace(fn);
    if (fresh) {
      it->second.buffer.resize(fn->num_inputs());
      discovered.push_back(fn);
      stack.push_back(fn);
    }
  };
  for (auto& [e, g] : seeds)
    visit(e.fn.get());
  while (!stack.empty()) {
    node* fn = stack.back();
    stack.pop_back();
    for (const auto& next : fn->next_edges()) {
      if (!next.valid())
        continue;
      visit(next.fn.get());
      ++states[next.fn.get()].dependencies;
    }
  }

  if (!accumulate) {
    // grad(): run only nodes that lead to a captured edge; never accumulate.
    for (const auto& c : captures) {
      auto it = states.find(c.where.fn.get());
      if (it != states.end())
        it->second.captures.push_back(c.slot);
    }
    // Reverse topological order: children before parents. Kahn's order on
    // the dependency counts gives a topological order from the roots.
    std::unordered_map<node*, std::size_t> pending;
    for (auto& [fn, st] : states)
      pending[fn] = st.dependencies;
    std::vector<node*> order;
    for (node* fn : discovered)
      if (pending[fn] == 0)
        order.push_back(fn);
    for (std::size_t i = 0; i < order.size(); ++i)
      for (const auto& next : order[i]->next_edges())
        if (next.valid() && --pending[next.fn.get()] == 0)
          order.push_back(next.fn.get());
    std::unordered_set<node*> leads_to_capture;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      auto& st = states[*it];
      bool needed = false;
      for (const auto& next : (*it)->next_edges())
        if (next.valid() && (leads_to_capture.count(next.fn.get()) ||
                             !states[next.fn.get()].captures.empty()))
          needed = true;
      st.execute = needed && dynamic_cast<accumulate_grad*>(*it) == nullptr;
      if (needed || !st.captures.empty())
        leads_to_capture.insert(*it);
    }
  }

  for (auto& [e, g] : seeds)
    add_into(states[e.fn.get()].buffer[e.input_nr], g);

  std::priority_queue<ready_entry> ready;
  std::uint64_t pushes = 0;
  for (node* fn : discovered)
    if (states[fn].dependencies == 0)
      ready.push({fn->sequence_nr(), pushes++, fn});

  std::vector<tensor> results(num_results);
  while (!ready.empty()) {
    node* fn = ready.top().fn;
    ready.pop();
    auto& st = states[fn];
    std::vector<tensor> inputs = std::move(st.buffer);

    for (std::size_t slot : st.captures)
      for (const auto& c : captures)
        if (c.slot == slot)
          results[slot] = inputs[c.where.input_nr];

    std::vector<tensor> outputs;
    bool any_defined = false;
    for (const auto& g : inputs)
      any_defined = any_defined || g.defined();
    if (st.execute && any_defined) {
      pass_scope scope(accumulate);
      outputs = fn->apply(std::move(inputs));
      TROUPE_ASSERT(outputs.size() == fn->next_edges().size() || fn->next_edges().empty(),
                    "{} returned {} gradients for {} inputs", fn->name(), outputs.size(),
                    fn->next_edges().size());
      if (!retain_graph)
        fn->release_saved();
    }

    const auto& nexts = fn->next_edges();
    for (std::size_t i = 0; i < nexts.size(); ++i) {
      if (!nexts[i].valid())
        continue;
      auto& next_state = states[nexts[i].fn.get()];
      if (i < outputs.size())
        add_into(next_state.buffer[nexts[i].input_nr], outputs[i]);
      if (--next_state.dependencies == 0)
        ready.push({nexts[i].fn->sequence_nr(), pushes++, nexts[i].fn.get()});
    }
  }
  return results;
}

} // namespace

pass_scope::pass_scope(bool accumulating) noexcept : previous_(accumulating_pass) {
  accumulating_pass = accumulating;
}
pass_scope::~pass_scope() { accumulating_pass = previous_; }
bool pass_scope::accumulating() noexcept { return accumulating_pass; }

void backward(std::span<const variable> roots, std::span<const tensor> grads,
              backward_options options) {
  // Backward itself records nothing (no double backward).
  no_grad_guard no_grad;
  run_pass(roots, grads, {}, 0, options.retain_graph, "backward");
}

void backward(const variable& loss, backward_options options) {
  require(loss.defined(), "backward: the loss is undefined");
  require(loss.numel() == 1,
          "backward: without explicit gradients the root must have one element, got shape {}",
          loss.shape());
  auto one = tensor::ones(loss.shape(), loss.type(), loss.data().where());
  backward(std::span<const variable>(&loss, 1), std::span<const tensor>(&one, 1), options);
}

std::vector<tensor> grad(std::span<const variable> outputs, std::span<const tensor> grad_outputs,
                         std::span<const variable> inputs, backward_options options) {
  no_grad_guard no_grad;
  std::vector<capture_target> captures;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    require(inputs[i].defined(), "grad: input {} is undefined", i);
    auto e = gradient_edge(inputs[i]);
    if (e.valid())
      captures.push_back({std::move(e), i});
  }
  if (captures.empty())
    return std::vector<tensor>(inputs.size());
  auto results = run_pass(outputs, grad_outputs, captures, inputs.size(), options.retain_graph,
                          "grad");
  for (auto& r : results)
    if (r.defined() && !r.is_contiguous())
      r = r.contiguous();
  return results;
}

} // namespace troupe::autograd
