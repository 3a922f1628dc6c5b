#include "troupe/autograd/deferred_weight_grads.hpp"

#include <algorithm>

#include "pass.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::autograd {

namespace {
thread_local deferred_weight_grads* active_deferral = nullptr;
} // namespace

void deferred_weight_grads::defer(const std::shared_ptr<node>& accumulator, tensor dy, tensor x) {
  TROUPE_ASSERT(accumulator != nullptr && dy.rank() == 2 && x.rank() == 2 && dy.size(0) == x.size(0),
                "deferred_weight_grads::defer: dy {} and x {} must be [rows, out] and [rows, in]", dy.shape(),
                x.shape());
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const pending_weight& p) { return p.accumulator == accumulator; });
  if (it == pending_.end()) {
    pending_.push_back({accumulator, {}, {}});
    it = std::prev(pending_.end());
  }
  bytes_ += dy.nbytes() + x.nbytes();
  it->dy.push_back(std::move(dy));
  it->x.push_back(std::move(x));
}

void deferred_weight_grads::deliver(pending_weight& p) {
  // One GEMM over all rows; the concatenation copies activations (rows x
  // features), which is small beside the [out, in] product it saves m - 1
  // times.
  auto dy = p.dy.size() == 1 ? p.dy.front() : cat(p.dy, 0);
  auto x = p.x.size() == 1 ? p.x.front() : cat(p.x, 0);
  p.dy.clear();
  p.x.clear();
  if (auto* leaf = dynamic_cast<accumulate_grad*>(p.accumulator.get())) {
    leaf->accumulate_product(dy.t(), x);
    return;
  }
  std::vector<tensor> grads;
  grads.push_back(matmul(dy.t(), x));
  p.accumulator->apply(std::move(grads));
}

void deferred_weight_grads::flush() {
  // Taken first: a hook that throws leaves nothing half-delivered behind to
  // be delivered twice by a later flush.
  auto pending = std::move(pending_);
  pending_.clear();
  bytes_ = 0;
  // Delivered as backward() delivers: into leaves, not a grad() pass.
  pass_scope scope(true);
  for (auto& p : pending)
    deliver(p);
}

bool deferred_weight_grads::flush_one() {
  if (pending_.empty())
    return false;
  auto p = std::move(pending_.front());
  pending_.erase(pending_.begin());
  for (std::size_t i = 0; i < p.dy.size(); ++i)
    bytes_ -= p.dy[i].nbytes() + p.x[i].nbytes();
  pass_scope scope(true);
  deliver(p);
  return true;
}

deferral_scope::deferral_scope(deferred_weight_grads& target) noexcept : previous_(active_deferral) {
  active_deferral = &target;
}

deferral_scope::~deferral_scope() { active_deferral = previous_; }

deferred_weight_grads* deferral_scope::active() noexcept { return active_deferral; }

} // namespace troupe::autograd
