#pragma once
// The joining side of the guarded control plane (control_plane_listener.hpp):
// troupe opens the connection, finishes TLS when the job uses it, sends the
// preamble, and only then gives the socket to CAF's BASP broker, which does
// its own handshake on it as if CAF had connected.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "troupe/tensor/expected.hpp"

namespace troupe::actors::control_plane {

class tls_context;

/// The actor published at `host:port`, or an error naming what failed
/// (resolving, connecting, TLS, the peer's BASP handshake) within `timeout`.
troupe::expected<caf::actor> connect(caf::actor_system& system, const std::string& host, std::uint16_t port,
                                     std::uint64_t token, const std::shared_ptr<const tls_context>& tls,
                                     std::chrono::milliseconds timeout);

} // namespace troupe::actors::control_plane
