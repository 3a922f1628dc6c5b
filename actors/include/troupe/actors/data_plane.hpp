#pragma once
// The data plane: tensor messages between processes over UCX active
// messages (docs/design.md, "The two planes").
//
// Thread model. One transport thread per node owns the UCX context and
// worker (UCS_THREAD_MODE_SINGLE). It sleeps in epoll on the worker's event
// fd and on an eventfd that other threads write to when they hand it work,
// so an idle node uses no CPU. send() and connect() may be called from any
// thread; they queue work for the transport thread. Receive handlers and
// send completions run on the transport thread.
//
// Wire (AM ids in data_plane_wire):
//   hello   header = magic, token, sender's peer id for this link, node name.
//   data    header = Cap'n Proto header frame of encode() (token and flow id
//           inside), data = the tensor's bytes, straight from its memory.
//   ack     header = the data sender's peer id, bytes, messages (credits).
//   goodbye header = magic, token, sender's peer id: "I am closing".
//   arena   header = magic, region offset, length, name and header sizes,
//           the arena's name, then the Cap'n Proto header frame (token and
//           flow id inside); no data: the receiver maps the region (same
//           host only). Credits and acks as for data.
//   release header = magic, token, region offset, length, name size, the
//           arena's name: "I am done with this region" (no credits).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "troupe/actors/data_plane_options.hpp"
#include "troupe/actors/tensor_message.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

/// Active-message ids and constants of the data plane's wire protocol
/// (public for tools and for tests that inject raw frames).
struct data_plane_wire {
  static constexpr unsigned hello_am = 0x7401;
  static constexpr unsigned data_am = 0x7402;
  static constexpr unsigned ack_am = 0x7403;
  static constexpr unsigned goodbye_am = 0x7404;
  static constexpr unsigned arena_am = 0x7405;
  static constexpr unsigned release_am = 0x7406;
  /// Longest arena name and Cap'n Proto header accepted in an arena frame.
  static constexpr std::size_t max_arena_name_bytes = 255;
  static constexpr std::size_t max_arena_header_bytes = 64 << 10;
  /// "troupeDP", first word of hello and goodbye headers.
  static constexpr std::uint64_t magic = 0x5044'6570'756f'7274ull;
  /// Longest node name accepted in a hello.
  static constexpr std::size_t max_name_bytes = 256;
};

/// Called on the transport thread once UCX no longer needs the message:
/// the send completed locally (success) or failed.
using completion_callback = std::function<void(expected<void> result)>;

/// Counters since start; snapshot by data_plane::stats().
struct data_plane_stats {
  std::uint64_t messages_sent = 0;      ///< completed sends
  std::uint64_t bytes_sent = 0;         ///< payload bytes of completed sends
  std::uint64_t send_failures = 0;
  std::uint64_t messages_received = 0;  ///< delivered to the receive handler
  std::uint64_t bytes_received = 0;     ///< payload bytes delivered
  std::uint64_t rendezvous_receives = 0;
  std::uint64_t eager_receives = 0;
  /// Eager payloads copied into a receive buffer (UCX gave no persistent,
  /// aligned data; over tcp UCX has copied already anyway).
  std::uint64_t eager_copies = 0;
  /// Deliveries whose tensor points at the very buffer UCX wrote into (a
  /// rendezvous buffer or UCX's persistent eager data).
  std::uint64_t zero_copy_deliveries = 0;
  std::uint64_t dropped_malformed = 0;  ///< header failed validation
  std::uint64_t dropped_oversized = 0;  ///< above max_message_bytes
  std::uint64_t dropped_bad_token = 0;  ///< missing or wrong job token
  std::uint64_t dropped_unknown_peer = 0;
  /// Connections to UCX's TCP listener closed for not sending UCX's
  /// handshake within data_plane_options::handshake_deadline.
  std::uint64_t silent_connections_closed = 0;
  std::uint64_t back_pressure_refusals = 0; ///< send() refused: queue full
  std::uint64_t arena_handoffs_sent = 0;     ///< send_by_reference() frames completed
  std::uint64_t arena_handoffs_received = 0; ///< handed to on_arena
  std::uint64_t releases_sent = 0;
  std::uint64_t releases_received = 0;       ///< handed to on_release
  /// The most bytes ever unacknowledged towards any one peer.
  std::uint64_t max_in_flight_bytes = 0;
  /// Rendezvous sends posted and rendezvous payloads being pulled that UCX
  /// has not completed yet (the transport thread polls while any is, see
  /// data_plane_options::spin_while_transferring): 0 once traffic is over.
  std::uint64_t rendezvous_in_progress = 0;
};

/// One node's data plane. Create with start(); close() (or the destructor)
/// says goodbye to every peer, flushes and closes the endpoints and stops
/// the transport thread.
class data_plane {
public:
  class impl;

  /// Starts UCX and the transport thread. Errors: errc::invalid_argument for
  /// bad options, errc::io_error when UCX or the OS refuses.
  static expected<std::unique_ptr<data_plane>> start(data_plane_options options);

  ~data_plane();
  data_plane(const data_plane&) = delete;
  data_plane& operator=(const data_plane&) = delete;

  /// This worker's UCX address; give it to peers over the control plane.
  std::vector<std::byte> address() const;

  /// Connects to a peer's worker address (from its address()), says hello
  /// with this job's token, and returns the id to send to. Connecting twice
  /// to the same name returns the same id. Bounded wait (5 s).
  /// `on_another_host`: sends to it follow network_eager_bytes.
  expected<peer_id> connect(std::string peer_name, std::span<const std::byte> address,
                            bool on_another_host = false);

  /// A peer known by name (connected to, or one that connected here and
  /// said hello); errc::invalid_argument when there is none.
  expected<peer_id> find_peer(const std::string& peer_name) const;
  std::string peer_name(peer_id peer) const;

  /// Sends `message` to `peer`; thread-safe, never blocks on the network.
  /// The header and tensor stay alive until `done` runs on the transport
  /// thread. Refuses at once (and does not call `done`) for an unknown or
  /// closed peer, a CPU-less or oversized tensor, or a full queue
  /// (back-pressure: errc::size_limit_exceeded; retry after a completion).
  expected<void> send(peer_id peer, tensor_message message, completion_callback done = {});

  /// Hands `message.value` to a same-host `peer` by reference: `region` is
  /// where it lies in this node's shared arena (shared_arena::share_region,
  /// which the caller has counted as lent). Only the region and the header
  /// travel; the peer's on_arena maps it. Ordered with send() to the same
  /// peer, same credits and back-pressure.
  expected<void> send_by_reference(peer_id peer, tensor_message message, const arena_ref& region,
                                   completion_callback done = {});

  /// Tells `peer` (the owner of `region`'s arena) that this node is done
  /// with `region`. Thread-safe, never blocks, never refused while the
  /// plane runs (a release must not be lost: the owner would leak the region).
  void send_release(peer_id peer, const arena_ref& region);

  /// Drops a peer (its process died, says the control plane): fails its
  /// queued sends and force-closes the endpoint.
  void disconnect(peer_id peer);

  data_plane_stats stats() const;
  /// Unacknowledged bytes towards `peer` right now and at most so far.
  std::size_t in_flight_bytes(peer_id peer) const;
  std::size_t max_in_flight_bytes(peer_id peer) const;

  /// Whether `p` lies inside a receive buffer this data plane handed to UCX
  /// and that a delivered tensor still holds (zero-copy checks in tests).
  bool is_receive_buffer(const void* p) const;

  /// Announce-then-close; idempotent. Call it from a thread of your own,
  /// never from a receive handler or completion (those run on the transport
  /// thread, which close() joins).
  void close();

private:
  explicit data_plane(std::shared_ptr<impl> state);
  std::shared_ptr<impl> impl_;
};

} // namespace troupe::actors
