// A peer's send queue, credits and rendezvous slots (data_plane_send_queue.hpp).
#include "data_plane_send_queue.hpp"

namespace troupe::actors::detail {

send_queue::send_queue(const data_plane_options& options)
    : max_waiting_(options.max_queued_sends),
      max_rendezvous_(options.max_rendezvous_in_flight),
      credits_(options.credit_window_bytes) {}

std::unique_ptr<send_op> send_queue::take_ready() {
  if (waiting_.empty() || !credits_.can_send(waiting_.front()->credit_bytes))
    return nullptr;
  auto& next = *waiting_.front();
  if (next.rendezvous) {
    if (max_rendezvous_ != 0 && rendezvous_in_flight_ >= max_rendezvous_)
      return nullptr; // complete_send() frees a slot (sent()); drain() pumps again
    ++rendezvous_in_flight_;
  }
  credits_.acquire(next.credit_bytes);
  in_flight_ = credits_.in_flight();
  high_water_ = credits_.high_water();
  auto op = std::move(waiting_.front());
  waiting_.pop_front();
  return op;
}

void send_queue::sent(const send_op& op) noexcept {
  if (op.rendezvous && rendezvous_in_flight_ > 0)
    --rendezvous_in_flight_;
}

void send_queue::return_credits(std::size_t bytes) noexcept {
  credits_.release(bytes);
  in_flight_ = credits_.in_flight();
}

} // namespace troupe::actors::detail
