#pragma once
// Credit-based flow control for one edge (sender -> receiver) of the data
// plane: a bound on the bytes a sender may have in flight.
#include <algorithm>
#include <cstddef>

namespace troupe::actors {

/// Bytes in flight on one edge, bounded by a window. Not thread-safe: the
/// data plane's transport thread is its only user.
///
/// A message takes `bytes` credits when it is handed to UCX and gives them
/// back when the receiver acknowledges delivery (or the send fails). A
/// message larger than the whole window may still go when nothing else is in
/// flight, otherwise it could never be sent; the bound is then that message.
class credit_window {
public:
  explicit credit_window(std::size_t window_bytes) : window_(window_bytes) {}

  /// Whether a message of `bytes` may be handed to UCX now.
  bool can_send(std::size_t bytes) const noexcept {
    return in_flight_ == 0 || in_flight_ + bytes <= window_;
  }

  /// Takes `bytes` credits (call only after can_send()).
  void acquire(std::size_t bytes) noexcept {
    in_flight_ += bytes;
    high_water_ = std::max(high_water_, in_flight_);
  }

  /// Gives back `bytes` credits; a peer acknowledging more than is in flight
  /// (a bug or a lie) cannot push the count below zero.
  void release(std::size_t bytes) noexcept { in_flight_ -= std::min(bytes, in_flight_); }

  std::size_t window() const noexcept { return window_; }
  std::size_t in_flight() const noexcept { return in_flight_; }
  /// The most bytes ever in flight at once.
  std::size_t high_water() const noexcept { return high_water_; }

private:
  std::size_t window_;
  std::size_t in_flight_ = 0;
  std::size_t high_water_ = 0;
};

} // namespace troupe::actors
