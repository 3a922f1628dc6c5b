// Credits and priorities of the pipeline schedules.
#include "troupe/parallel/schedule.hpp"

#include <algorithm>

#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

schedule_kind schedule_named(std::string_view name) {
  for (auto kind : {schedule_kind::gpipe, schedule_kind::one_f_one_b})
    if (name == name_of(kind))
      return kind;
  throw usage_error(fmt::format("schedule '{}' is not gpipe or 1f1b", name));
}

schedule_policy policy_for(schedule_kind kind, std::size_t stage, std::size_t stages,
                           std::size_t micro_batches) {
  require(stage < stages, "schedule: stage {} of {} stages", stage, stages);
  require(micro_batches >= 1, "schedule: {} micro-batches; need at least one", micro_batches);
  schedule_policy policy;
  policy.micro_batches = micro_batches;
  if (kind == schedule_kind::gpipe) {
    policy.credits = micro_batches;
    policy.backward_first = false;
  } else {
    policy.credits = std::min(micro_batches, stages - stage);
    policy.backward_first = true;
  }
  return policy;
}

void work_queue::push(actors::tensor_message work) {
  if (work.meta.kind == message_kind::backward_gradient)
    backwards_.push_back(std::move(work));
  else
    forwards_.push_back(std::move(work));
}

std::optional<work_queue::position> work_queue::next_in_order() const noexcept {
  const bool forward = forwards_taken_ < policy_.micro_batches && in_flight_ < policy_.credits;
  if (!forward && backwards_taken_ == forwards_taken_)
    return std::nullopt; // every forward taken so far has had its backward
  const auto& queue = forward ? forwards_ : backwards_;
  const auto micro_batch = forward ? forwards_taken_ : backwards_taken_;
  for (std::size_t i = 0; i < queue.size(); ++i)
    if (queue[i].meta.micro_batch == micro_batch)
      return position{forward, i};
  return std::nullopt;
}

bool work_queue::has_runnable() const noexcept {
  if (policy_.fixed_order)
    return next_in_order().has_value();
  return !backwards_.empty() || (!forwards_.empty() && in_flight_ < policy_.credits);
}

std::optional<actors::tensor_message> work_queue::pop() {
  if (policy_.fixed_order) {
    const auto next = next_in_order();
    if (!next)
      return std::nullopt;
    auto& queue = next->forward ? forwards_ : backwards_;
    auto work = std::move(queue[next->index]);
    queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(next->index));
    if (next->forward) {
      ++forwards_taken_;
      ++in_flight_;
      peak_in_flight_ = std::max(peak_in_flight_, in_flight_);
    } else if (++backwards_taken_ == policy_.micro_batches) {
      forwards_taken_ = backwards_taken_ = 0; // the step's last backward: the next step starts over
    }
    return work;
  }
  const bool forward_ready = !forwards_.empty() && in_flight_ < policy_.credits;
  const bool backward_ready = !backwards_.empty();
  if (backward_ready && (policy_.backward_first || !forward_ready)) {
    auto work = std::move(backwards_.front());
    backwards_.pop_front();
    return work;
  }
  if (forward_ready) {
    auto work = std::move(forwards_.front());
    forwards_.pop_front();
    ++in_flight_;
    peak_in_flight_ = std::max(peak_in_flight_, in_flight_);
    return work;
  }
  return std::nullopt;
}

void work_queue::finished_backward() {
  TROUPE_ASSERT(in_flight_ > 0, "work_queue: a backward finished with no micro-batch in flight");
  --in_flight_;
}

void work_queue::clear() {
  forwards_.clear();
  backwards_.clear();
  in_flight_ = 0;
  forwards_taken_ = backwards_taken_ = 0;
}

} // namespace troupe::parallel
