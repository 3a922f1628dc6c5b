#pragma once
// One peer's sending side of the data plane's flow control: the bounded
// queue of sends waiting for credits (step 1 of "Flow control, step by
// step" in data_plane.cpp), the credit window they take from when they are
// handed to UCX (step 2) and that acks give back (step 5), and the cap on
// rendezvous sends in UCX at once (the first refinement). Kept apart from
// the transport so that these bounds are kept in one small place; posting
// to UCX and completing sends is data_plane_send.cpp's.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "credit_window.hpp"
#include "troupe/actors/data_plane.hpp"
#include "troupe/serialization/encoded_message.hpp"

namespace troupe::actors::detail {

/// One message from send() until UCX completes it: its header and tensor
/// live here, so UCX may read them until then.
struct send_op {
  data_plane::impl* owner = nullptr;
  peer_id to = 0;
  encoded_message encoded;
  std::size_t credit_bytes = 0;
  bool rendezvous = false; // takes one of send_queue's rendezvous slots
  bool eager = false;      // UCX must not choose rendezvous either (a peer on another host)
  completion_callback done;
  std::int64_t start_ns = 0; // trace: when send() took it
  std::uint64_t flow = 0;
  // An arena frame (send_by_reference) instead of header + payload.
  unsigned am_id = data_plane_wire::data_am;
  std::vector<std::byte> frame;
  std::size_t trace_bytes = 0; // the tensor's bytes, for the trace
};

/// The sends waiting for one peer and what lets them go. The queue and the
/// rendezvous slots are guarded by the data plane's mutex_ (send() queues
/// from any thread); the credits belong to the transport thread, and
/// in_flight() / high_water() mirror them for any thread.
class send_queue {
public:
  /// Bounds from credit_window_bytes, max_queued_sends and
  /// max_rendezvous_in_flight.
  explicit send_queue(const data_plane_options& options);

  // -- under the data plane's mutex_ ------------------------------------------

  /// Whether max_queued_sends are waiting already: send() refuses at once
  /// (back-pressure to the caller, never an unbounded queue).
  bool full() const noexcept { return waiting_.size() >= max_waiting_; }
  std::size_t waiting() const noexcept { return waiting_.size(); }
  void push(std::unique_ptr<send_op> op) { waiting_.push_back(std::move(op)); }

  /// The oldest waiting send, if the window has room for it and, for a
  /// rendezvous send, fewer than max_rendezvous_in_flight are in UCX; it
  /// takes its credits (and slot). nullptr when it must wait.
  std::unique_ptr<send_op> take_ready();

  /// `op` left UCX (completed or failed): its rendezvous slot comes free.
  void sent(const send_op& op) noexcept;

  /// Every waiting send, for failing them when the peer goes away.
  std::deque<std::unique_ptr<send_op>> take_all() { return std::exchange(waiting_, {}); }

  // -- transport thread -------------------------------------------------------

  /// The receiver acknowledged `bytes`, or a send failed and no ack will
  /// come for them.
  void return_credits(std::size_t bytes) noexcept;

  // -- any thread -------------------------------------------------------------

  /// Unacknowledged bytes now, and at most so far.
  std::size_t in_flight() const noexcept { return in_flight_.load(); }
  std::size_t high_water() const noexcept { return high_water_.load(); }

private:
  std::deque<std::unique_ptr<send_op>> waiting_;
  std::size_t max_waiting_;
  std::size_t max_rendezvous_; // 0: no cap beyond the window
  std::size_t rendezvous_in_flight_ = 0; // posted, not completed
  credit_window credits_;
  std::atomic<std::size_t> in_flight_{0};
  std::atomic<std::size_t> high_water_{0};
};

} // namespace troupe::actors::detail
