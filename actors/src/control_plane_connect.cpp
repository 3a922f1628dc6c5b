#include "control_plane_connect.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include <caf/actor_system.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/scoped_actor.hpp>

#include <fmt/format.h>

#include "control_plane_preamble.hpp"
#include "control_plane_tls.hpp"

namespace troupe::actors::control_plane {

namespace {

namespace net = caf::io::network;
using clock = std::chrono::steady_clock;

struct socket_guard {
  int fd = -1;
  ~socket_guard() {
    if (fd >= 0)
      ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

int remaining_ms(clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits until `fd` is ready for `events`; false at the deadline.
bool wait_for(int fd, short events, clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int left = remaining_ms(deadline);
    int rc = ::poll(&p, 1, left);
    if (rc > 0)
      return true;
    if (rc == 0 || (rc < 0 && errno != EINTR))
      return false;
  }
}

troupe::expected<int> open_connection(const std::string& host, std::uint16_t port, clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  auto service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return make_error(errc::io_error, "cannot resolve {}: {}", host, gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, &freeaddrinfo);
  std::string last = "no address";
  for (auto* a = found; a; a = a->ai_next) {
    socket_guard s{::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol)};
    if (s.fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    if (::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = std::strerror(errno);
      continue;
    }
    if (!wait_for(s.fd, POLLOUT, deadline)) {
      last = "connecting timed out";
      continue;
    }
    int error = 0;
    socklen_t length = sizeof error;
    getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &error, &length);
    if (error != 0) {
      last = std::strerror(error);
      continue;
    }
    return s.release();
  }
  return make_error(errc::io_error, "cannot connect to {}:{}: {}", host, port, last);
}

troupe::expected<void> send_plain(int fd, std::span<const std::byte> bytes, clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    auto n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, POLLOUT, deadline))
        return make_error(errc::io_error, "sending the preamble timed out");
    } else {
      return make_error(errc::io_error, "sending the preamble failed: {}", std::strerror(errno));
    }
  }
  return {};
}

// Drives a TLS client handshake and the preamble through the session.
troupe::expected<void> tls_preamble(SSL* ssl, int fd, std::span<const std::byte> bytes, clock::time_point deadline) {
  std::string why;
  for (;;) {
    auto step = handshake_step(ssl, false, why);
    if (step == tls_step::done)
      break;
    if (step == tls_step::failed)
      return make_error(errc::io_error, "TLS handshake failed: {}", why);
    if (!wait_for(fd, step == tls_step::want_read ? POLLIN : POLLOUT, deadline))
      return make_error(errc::io_error, "the TLS handshake timed out");
  }
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    tls_step step;
    auto n = write_step(ssl, bytes.data() + sent, bytes.size() - sent, step, why);
    if (n < 0)
      return make_error(errc::io_error, "sending the preamble failed: {}", why);
    sent += static_cast<std::size_t>(n);
    if (n == 0 && !wait_for(fd, step == tls_step::want_read ? POLLIN : POLLOUT, deadline))
      return make_error(errc::io_error, "sending the preamble timed out");
  }
  return {};
}

} // namespace

troupe::expected<caf::actor> connect(caf::actor_system& system, const std::string& host, std::uint16_t port,
                                     std::uint64_t token, const std::shared_ptr<const tls_context>& tls,
                                     std::chrono::milliseconds timeout) {
  auto deadline = clock::now() + timeout;
  auto opened = open_connection(host, port, deadline);
  if (!opened)
    return opened.error();
  socket_guard s{*opened};
  auto preamble = encode_preamble(token);
  auto& backend = static_cast<net::default_multiplexer&>(system.middleman().backend());
  caf::io::scribe_ptr scribe;
  if (tls) {
    auto session = tls->session(s.fd, false);
    if (!session)
      return session.error();
    if (auto ok = tls_preamble(session->get(), s.fd, preamble, deadline); !ok)
      return ok.error();
    scribe = make_tls_scribe(backend, s.release(), std::move(*session));
  } else {
    if (auto ok = send_plain(s.fd, preamble, deadline); !ok)
      return ok.error();
    scribe = backend.new_scribe(s.release());
  }
  // From here on the broker owns the socket and runs BASP's handshake; its
  // answer names the actor published on that port.
  auto broker = system.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  caf::actor result;
  std::string failure = "no answer";
  caf::scoped_actor self{system};
  self
    ->request(broker, std::chrono::milliseconds(std::max(1, remaining_ms(deadline))), caf::connect_atom::value,
              std::move(scribe), port)
    .receive(
      [&](caf::node_id&, caf::strong_actor_ptr& published, std::set<std::string>&) {
        if (published)
          result = caf::actor_cast<caf::actor>(std::move(published));
        else
          failure = "nothing is published on that port";
      },
      [&](caf::error& err) { failure = system.render(err); });
  if (!result)
    return make_error(errc::io_error, "{}:{} did not complete the BASP handshake: {}", host, port, failure);
  return result;
}

} // namespace troupe::actors::control_plane
