#include "troupe/autograd/variable.hpp"

#include <algorithm>
#include <atomic>

#include "troupe/autograd/grad_mode.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/autograd/node.hpp"

namespace troupe::autograd {

namespace {

std::atomic<std::uint64_t> next_sequence_nr{0};

const std::shared_ptr<variable_impl>& checked(const std::shared_ptr<variable_impl>& impl,
                                              const char* what) {
  require(impl != nullptr, "variable::{}: the variable is undefined", what);
  return impl;
}

} // namespace

node::node() : sequence_nr_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

node::~node() {
  // Dropping the last handle to a graph would otherwise recurse once per
  // node along the chain (a long unrolled loop overflows the stack). The
  // outermost destructor drains a worklist that nested ones only append to.
  // A raw pointer, so no thread_local with a destructor is involved.
  thread_local std::vector<std::shared_ptr<node>>* deferred = nullptr;
  if (deferred != nullptr) {
    for (auto& e : next_edges_)
      if (e.fn)
        deferred->push_back(std::move(e.fn));
    return;
  }
  std::vector<std::shared_ptr<node>> worklist;
  for (auto& e : next_edges_)
    if (e.fn)
      worklist.push_back(std::move(e.fn));
  deferred = &worklist;
  while (!worklist.empty()) {
    auto next = std::move(worklist.back());
    worklist.pop_back();
    next.reset(); // may run ~node, which appends to the worklist
  }
  deferred = nullptr;
}

variable::variable(tensor data, bool requires_grad) : impl_(std::make_shared<variable_impl>()) {
  require(data.defined(), "variable: cannot wrap an undefined tensor");
  require(!requires_grad || is_floating(data.type()),
          "variable: only floating tensors can require a gradient, got {}", data.type());
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

variable variable::make_result(tensor data, std::shared_ptr<node> fn, std::uint32_t output_index) {
  TROUPE_ASSERT(fn != nullptr, "make_result without a node");
  variable out;
  out.impl_ = std::make_shared<variable_impl>();
  out.impl_->data = std::move(data);
  out.impl_->requires_grad = true;
  out.impl_->output_nr = output_index;
  if (fn->num_inputs() <= output_index)
    fn->set_num_inputs(output_index + 1);
  out.impl_->grad_fn = std::move(fn);
  return out;
}

variable variable::from_impl(std::shared_ptr<variable_impl> impl) noexcept {
  variable out;
  out.impl_ = std::move(impl);
  return out;
}

const tensor& variable::data() const { return checked(impl_, "data")->data; }

void variable::set_data(tensor data) {
  checked(impl_, "set_data");
  require(data.defined(), "variable::set_data: undefined tensor");
  require(!impl_->requires_grad || is_floating(data.type()),
          "variable::set_data: a variable requiring a gradient needs floating data, got {}",
          data.type());
  impl_->data = std::move(data);
}

bool variable::requires_grad() const { return impl_ && impl_->requires_grad; }

void variable::set_requires_grad(bool flag) {
  checked(impl_, "set_requires_grad");
  require(impl_->grad_fn == nullptr,
          "variable::set_requires_grad: only leaves can change requires_grad; detach() first");
  require(!flag || is_floating(impl_->data.type()),
          "variable::set_requires_grad: only floating tensors can require a gradient, got {}",
          impl_->data.type());
  impl_->requires_grad = flag;
}

bool variable::is_leaf() const { return checked(impl_, "is_leaf")->grad_fn == nullptr; }

tensor variable::grad() const { return checked(impl_, "grad")->grad; }

void variable::set_grad(tensor grad) {
  checked(impl_, "set_grad");
  if (grad.defined()) {
    require(grad.shape() == impl_->data.shape(),
            "variable::set_grad{}: gradient shape {} differs from data shape {}",
            impl_->name.empty() ? "" : " (" + impl_->name + ")", grad.shape(),
            impl_->data.shape());
    require(grad.type() == impl_->data.type(),
            "variable::set_grad: gradient dtype {} differs from data dtype {}", grad.type(),
            impl_->data.type());
  }
  impl_->grad = std::move(grad);
}

void variable::zero_grad() { checked(impl_, "zero_grad")->grad = tensor(); }

std::size_t variable::add_grad_ready_hook(grad_ready_hook hook) {
  checked(impl_, "add_grad_ready_hook");
  require(impl_->grad_fn == nullptr, "variable::add_grad_ready_hook: only on leaves");
  auto id = impl_->next_hook_id++;
  impl_->hooks.emplace_back(id, std::move(hook));
  return id;
}

void variable::remove_grad_ready_hook(std::size_t id) {
  checked(impl_, "remove_grad_ready_hook");
  std::erase_if(impl_->hooks, [id](const auto& entry) { return entry.first == id; });
}

const std::shared_ptr<node>& variable::grad_fn() const {
  static const std::shared_ptr<node> none;
  return impl_ ? impl_->grad_fn : none;
}

variable variable::detach() const { return variable(data(), false); }

const std::string& variable::name() const {
  static const std::string none;
  return impl_ ? impl_->name : none;
}

void variable::set_name(std::string name) { checked(impl_, "set_name")->name = std::move(name); }

// -- graph wiring ---------------------------------------------------------------

std::shared_ptr<node> grad_accumulator(const variable& leaf) {
  const auto& impl = leaf.impl();
  TROUPE_ASSERT(impl && impl->grad_fn == nullptr && impl->requires_grad,
                "grad_accumulator of a non-leaf or a leaf without requires_grad");
  if (auto existing = impl->grad_accumulator.lock())
    return existing;
  auto fresh = std::make_shared<accumulate_grad>(impl);
  impl->grad_accumulator = fresh;
  return fresh;
}

edge gradient_edge(const variable& v) {
  if (!v.defined() || !v.requires_grad())
    return {};
  if (v.impl()->grad_fn)
    return {v.impl()->grad_fn, v.impl()->output_nr};
  return {grad_accumulator(v), 0};
}

bool any_requires_grad(const std::vector<variable>& inputs) {
  if (!grad_enabled())
    return false;
  return std::any_of(inputs.begin(), inputs.end(),
                     [](const variable& v) { return v.requires_grad(); });
}

std::vector<tensor> accumulate_grad::apply(std::vector<tensor> grad_outputs) {
  TROUPE_ASSERT(grad_outputs.size() == 1, "accumulate_grad got {} gradients", grad_outputs.size());
  auto& g = grad_outputs[0];
  if (!g.defined())
    return {};
  require(g.shape() == leaf_->data.shape() && g.type() == leaf_->data.type(),
          "backward: gradient {} for leaf{} does not match its data {}", g, 
          leaf_->name.empty() ? "" : " " + leaf_->name, leaf_->data);
  if (!leaf_->grad.defined()) {
    // The optimizer updates grad() in place, so grad() must not alias a graph
    // buffer or a caller's tensor. When this handle is the only owner of a
    // dense buffer (a fresh GEMM result, typically) it is adopted as is —
    // as PyTorch does — which saves copying every weight gradient once a step.
    bool sole_owner = g.memory().use_count() == 1 && g.is_contiguous() && g.offset() == 0 &&
                      g.nbytes() == g.memory()->bytes();
    leaf_->grad = sole_owner ? std::move(g) : g.clone();
  } else {
    add_(leaf_->grad, g);
  }
  run_hooks();
  return {};
}

void accumulate_grad::accumulate_product(const tensor& a, const tensor& b) {
  auto& grad = leaf_->grad;
  const bool in_place = grad.defined() && a.rank() == 2 && b.rank() == 2 && grad.rank() == 2 &&
                        grad.size(0) == a.size(0) && grad.size(1) == b.size(1) && grad.type() == a.type() &&
                        grad.type() == b.type() && grad.where() == a.where() && grad.where() == b.where();
  if (!in_place) {
    std::vector<tensor> grads;
    grads.push_back(matmul(a, b));
    apply(std::move(grads));
    return;
  }
  addmm_(grad, a, b, 1.0, 1.0);
  run_hooks();
}

void accumulate_grad::run_hooks() {
  // Copy the hooks: a hook may add or remove hooks.
  auto hooks = leaf_->hooks;
  auto handle = variable::from_impl(leaf_);
  for (auto& [id, hook] : hooks)
    hook(handle);
}

std::string accumulate_grad::name() const {
  return leaf_->name.empty() ? "accumulate_grad" : "accumulate_grad(" + leaf_->name + ")";
}

} // namespace troupe::autograd
