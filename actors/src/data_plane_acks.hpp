#pragma once
// When the data plane's receiver sends its acks (step 4 of "Flow control,
// step by step" in data_plane.cpp, and its second refinement): acks are
// coalesced per peer, and one (bytes, messages) ack goes back when
// max_messages or max_bytes are owed to that peer, when the transport
// thread goes idle (always before it can sleep), or when the oldest owed
// ack has waited max_delay, so a credit is never held back longer than
// that. Kept apart so these bounds, which keep every sender's credits
// flowing, sit in one place; building and sending the ack frame is
// data_plane_receive.cpp's.
#include <chrono>
#include <cstddef>
#include <vector>

namespace troupe::actors::detail {

/// What one peer is owed; kept in its peer record.
struct owed_ack {
  std::size_t bytes = 0;
  std::size_t messages = 0;
  bool listed = false; // in ack_coalescer's list
};

/// The peers owed an ack. `Peer` is the data plane's peer record, with an
/// `owed_ack ack` member. Transport thread only.
template <class Peer> class ack_coalescer {
public:
  using clock_type = std::chrono::steady_clock;
  /// Why these bounds: data_plane.cpp, "Measured".
  static constexpr std::size_t max_messages = 16;
  static constexpr std::size_t max_bytes = std::size_t{256} << 10;
  /// The longest an owed ack waits while other peers keep the thread busy.
  static constexpr std::chrono::microseconds max_delay{200};

  /// Owes `p` an ack for one message of `bytes`; true when `p`'s ack must
  /// go at once (max_messages or max_bytes owed).
  bool owe(Peer& p, std::size_t bytes) {
    if (!p.ack.listed) {
      if (owed_.empty())
        owed_since_ = clock_type::now();
      p.ack.listed = true;
      owed_.push_back(&p);
    }
    p.ack.bytes += bytes;
    return ++p.ack.messages >= max_messages || p.ack.bytes >= max_bytes;
  }

  /// Whether the oldest owed ack has waited max_delay.
  bool overdue() const {
    return !owed_.empty() && clock_type::now() - owed_since_ >= max_delay;
  }

  /// Calls `flush(peer&)` for every peer owed an ack (it sends what is owed
  /// and zeroes the counts), then forgets them.
  template <class Flush> void flush_all(Flush&& flush) {
    for (auto* p : owed_) {
      p->ack.listed = false;
      flush(*p);
    }
    owed_.clear();
  }

private:
  std::vector<Peer*> owed_;           // peers with ack.messages > 0
  clock_type::time_point owed_since_; // when owed_ last became non-empty
};

} // namespace troupe::actors::detail
