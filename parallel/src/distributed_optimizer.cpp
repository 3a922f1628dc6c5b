#include "troupe/parallel/distributed_optimizer.hpp"

namespace troupe::parallel {

expected<void> distributed_optimizer::step() {
  if (local_)
    local_->step();
  for (auto* holder : remote_)
    if (auto ok = holder->step(); !ok)
      return ok;
  return {};
}

void distributed_optimizer::zero_grad() {
  if (local_)
    local_->zero_grad();
  for (auto* holder : remote_)
    holder->zero_grad();
}

} // namespace troupe::parallel
