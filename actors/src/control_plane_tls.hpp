#pragma once
// TLS for the control plane, owned by troupe rather than CAF's OpenSSL
// module. That module never empties OpenSSL's per-thread error queue (its
// only drain is inside a log statement that Debian's CAF compiles out), so
// one failed handshake from a stranger makes the next SSL_get_error of a
// healthy link on the same middleman thread report a fatal error, and the
// link closes (docs/design.md, "A stray connection never reaches BASP").
// Here every OpenSSL call starts with an empty queue and leaves one behind.
#include <memory>
#include <string>

#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/scribe.hpp>

#include "troupe/actors/tls.hpp"
#include "troupe/tensor/expected.hpp"

using SSL = struct ssl_st;
using SSL_CTX = struct ssl_ctx_st;

namespace troupe::actors::control_plane {

struct ssl_deleter {
  void operator()(SSL* ssl) const noexcept;
};
using ssl_ptr = std::unique_ptr<SSL, ssl_deleter>;

/// Certificate, key and CA of this node, and mutual verification: a peer
/// without a certificate signed by the job's CA fails the handshake.
class tls_context {
public:
  static troupe::expected<std::shared_ptr<tls_context>> load(const tls_options& options);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;

  /// A session on `fd` in the server (accepting) or client role.
  troupe::expected<ssl_ptr> session(int fd, bool server) const;

private:
  explicit tls_context(SSL_CTX* context) : context_(context) {}
  SSL_CTX* context_;
};

/// Where a non-blocking handshake step stands.
enum class tls_step { done, want_read, want_write, failed };

/// One step of SSL_accept / SSL_connect on a non-blocking socket. On
/// `failed`, `why` says what went wrong (OpenSSL's reason, the certificate
/// verification result).
tls_step handshake_step(SSL* ssl, bool server, std::string& why);

/// One non-blocking SSL_read / SSL_write; returns bytes moved, 0 when the
/// call would block (`step` says which way), -1 on failure (`why`).
long read_step(SSL* ssl, void* buffer, std::size_t length, tls_step& step, std::string& why);
long write_step(SSL* ssl, const void* buffer, std::size_t length, tls_step& step, std::string& why);

/// A CAF scribe that speaks BASP through an established session on `fd`
/// (which it then owns, with the session).
caf::io::scribe_ptr make_tls_scribe(caf::io::network::default_multiplexer& backend, int fd, ssl_ptr session);

} // namespace troupe::actors::control_plane
