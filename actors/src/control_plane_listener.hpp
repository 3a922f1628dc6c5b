#pragma once
// The guarded listener in front of CAF's BASP broker. CAF trusts the first
// byte of every accepted connection (docs/design.md, "A stray connection
// never reaches BASP"), so troupe accepts control-plane connections itself,
// on a thread of its own: a connection must finish the TLS handshake (when
// the job uses TLS) and send the job's preamble (control_plane_preamble.hpp)
// within a deadline before its socket is handed to the broker as if CAF's
// own acceptor had taken it. Everything else is closed with one rate-limited
// log line naming the peer and what was wrong; links already up, proxies and
// the job never see it.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "troupe/tensor/expected.hpp"

namespace troupe::actors::control_plane {

class tls_context;

struct listener_options {
  std::string node_name;   ///< names this node in the log lines
  std::uint64_t token = 0; ///< the job token every preamble must carry
  std::shared_ptr<const tls_context> tls; ///< null: plain TCP
  /// Connections still proving membership; a new one beyond this evicts the
  /// oldest, so silent clients cannot lock members out.
  std::size_t max_pending = 64;
  /// Time from accept to a complete preamble (TLS handshake included).
  std::chrono::milliseconds handshake_timeout{5000};
  /// At most one refusal line per interval; the others are counted into it.
  std::chrono::milliseconds log_interval{1000};
};

/// Listens on `address` (empty: every interface) and `port` (0: a free
/// one) for `whom`, like CAF's publish(), and returns the port.
troupe::expected<std::uint16_t> publish(caf::actor_system& system, const caf::actor& whom, std::uint16_t port,
                                        const std::string& address, listener_options options);

} // namespace troupe::actors::control_plane
