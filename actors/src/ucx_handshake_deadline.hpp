#pragma once
// A handshake deadline for the listening socket of UCX's TCP transport.
//
// UCX 1.13 accepts connections on a socket of its own (its port travels in
// the worker address) and waits for a new connection's first bytes without
// any deadline, so a client that connects and stays silent, or drips a byte
// now and then, holds a descriptor and a slot in UCX's tables for as long as
// it likes. troupe cannot change UCX, but the socket lives in this process:
// this sweeper finds connections accepted on UCX's port that have received
// fewer bytes than UCX's own connection handshake once the deadline passed,
// and shuts them down; UCX then reads an end of stream and frees them the way
// it frees any closed connection.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace troupe::actors::detail {

/// The ports of this process's TCP sockets in the listening state, each with
/// the socket's inode (so two snapshots tell which listener is new).
std::map<std::uint64_t, std::uint16_t> listening_tcp_sockets();

struct handshake_deadline_options {
  /// How long a new connection may take to send `handshake_bytes`.
  std::chrono::milliseconds deadline{5000};
  /// Fewer bytes than this received means UCX's connection handshake never
  /// arrived: UCX 1.13's TCP transport opens every connection with an 8-byte
  /// magic number and a connection request of at least 20 more bytes
  /// (src/uct/tcp/tcp.h), and a peer connects only to send wireup and data
  /// right after it. 24 leaves a margin below the shortest handshake.
  std::uint64_t handshake_bytes = 24;
  /// At most this many such connections are left pending; beyond it the
  /// oldest are shut down at once, deadline or not.
  std::size_t max_pending = 64;
};

/// One connection the sweep shut down, for the log.
struct swept_connection {
  std::string peer;   ///< "address:port"
  std::string reason; ///< what it failed to do
};

class ucx_handshake_deadline {
public:
  using clock_type = std::chrono::steady_clock;

  /// Watches connections accepted on any of `ports` (UCX's listeners).
  ucx_handshake_deadline(std::set<std::uint16_t> ports, handshake_deadline_options options = {});

  /// Scans this process's sockets once: connections that reached
  /// handshake_bytes are forgotten, new ones remembered, those past the
  /// deadline (or beyond max_pending, oldest first) shut down and returned.
  std::vector<swept_connection> sweep(clock_type::time_point now);

  /// Connections accepted on UCX's ports that have not yet sent its handshake.
  std::size_t pending() const { return pending_.size(); }

  const std::set<std::uint16_t>& ports() const { return ports_; }

private:
  struct pending_connection {
    int fd;
    clock_type::time_point first_seen;
    std::uint64_t bytes_received;
    std::string peer;
  };
  std::set<std::uint16_t> ports_;
  handshake_deadline_options options_;
  std::map<std::uint64_t, pending_connection> pending_; // by socket inode
};

} // namespace troupe::actors::detail
