#include "control_plane_listener.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <set>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/doorman.hpp>
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

std::string endpoint_text(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  std::uint16_t port = 0;
  if (address.ss_family == AF_INET) {
    auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    port = ntohs(v4->sin_port);
  } else if (address.ss_family == AF_INET6) {
    auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr))
      inet_ntop(AF_INET, &v6->sin6_addr.s6_addr[12], host, sizeof host);
    else
      inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
    port = ntohs(v6->sin6_port);
    if (!IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr))
      return fmt::format("[{}]:{}", host, port);
  }
  return fmt::format("{}:{}", host, port);
}

// A bound, listening, non-blocking socket: the given address, or every
// interface (IPv6 and IPv4 together where the kernel allows).
troupe::expected<int> listening_socket(const std::string& address, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = address.empty() ? AF_INET6 : AF_UNSPEC;
  auto service = std::to_string(port);
  std::string last = "no address";
  for (int attempt = 0; attempt < 2; ++attempt) {
    addrinfo* found = nullptr;
    if (int rc = getaddrinfo(address.empty() ? nullptr : address.c_str(), service.c_str(), &hints, &found); rc != 0) {
      last = gai_strerror(rc);
      hints.ai_family = AF_INET;
      continue;
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, &freeaddrinfo);
    for (auto* a = found; a; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last = std::strerror(errno);
        continue;
      }
      int on = 1, off = 0;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
      if (a->ai_family == AF_INET6 && address.empty())
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0)
        return fd;
      last = std::strerror(errno);
      ::close(fd);
    }
    if (!address.empty())
      break;
    hints.ai_family = AF_INET; // no IPv6 here: every IPv4 interface
  }
  return make_error(errc::io_error, "cannot listen on {}:{}: {}", address.empty() ? "*" : address, port, last);
}

std::uint16_t local_port(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0)
    return 0;
  if (address.ss_family == AF_INET)
    return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
}

// One accepted connection that has not yet proved membership.
struct pending {
  int fd = -1;
  std::string peer;
  clock::time_point deadline;
  ssl_ptr tls;
  bool handshaken = false; // TLS done (always true without TLS)
  short events = POLLIN;
  std::array<std::byte, preamble_size> preamble{};
  std::size_t received = 0;
};

// Accepts and vets connections on its own thread; hands the proven ones to
// the BASP broker through the middleman's event loop.
class guarded_doorman final : public caf::io::doorman {
public:
  guarded_doorman(net::default_multiplexer& backend, int listen_fd, listener_options options)
    : doorman(net::accept_hdl_from_socket(listen_fd)), backend_(backend), listen_fd_(listen_fd),
      options_(std::move(options)), wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  ~guarded_doorman() override {
    stop();
    if (wake_fd_ >= 0)
      ::close(wake_fd_);
  }

  void launch() override {
    if (!guard_.joinable())
      guard_ = std::thread([this] { run(); });
  }

  void graceful_shutdown() override {
    stop();
    detach(&backend_, false);
  }

  // Never driven by the multiplexer: connections arrive through hand_over().
  bool new_connection() override { return false; }

  std::string addr() const override {
    auto x = net::local_addr_of_fd(listen_fd_);
    return x ? *x : std::string{};
  }
  std::uint16_t port() const override { return local_port(listen_fd_); }

  void add_to_loop() override { paused_ = false; }
  void remove_from_loop() override { paused_ = true; }

private:
  void stop() {
    if (guard_.joinable()) {
      stopping_ = true;
      std::uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
      guard_.join();
    }
    for (auto& p : pending_)
      ::close(p.fd);
    pending_.clear();
    if (listen_fd_ >= 0)
      ::close(listen_fd_);
    listen_fd_ = -1;
  }

  // On the middleman's thread: the socket becomes one of the broker's
  // connections, exactly as if CAF's acceptor had taken it.
  void hand_over(int fd, ssl_ptr tls) {
    if (detached()) {
      ::close(fd);
      return;
    }
    caf::io::scribe_ptr scribe;
    if (tls) {
      int on = 1;
      setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
      scribe = make_tls_scribe(backend_, fd, std::move(tls));
    } else {
      scribe = backend_.new_scribe(fd);
    }
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    doorman::new_connection(&backend_, hdl);
  }

  void refuse(pending& p, const std::string& why) {
    ::close(p.fd);
    p.fd = -1;
    auto now = clock::now();
    if (now - last_log_ < options_.log_interval && last_log_ != clock::time_point{}) {
      ++unreported_;
      return;
    }
    std::string more = unreported_ > 0 ? fmt::format(" ({} more refused since the last report)", unreported_) : "";
    fmt::print(stderr, "troupe: node {} refused a control-plane connection from {}: {}{}\n", options_.node_name,
               p.peer, why, more);
    std::fflush(stderr);
    unreported_ = 0;
    last_log_ = now;
  }

  void accept_new() {
    for (int round = 0; round < 64; ++round) {
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0)
        return; // EAGAIN, or a connection reset before accept: nothing to do
      if (pending_.size() >= options_.max_pending) {
        refuse(pending_.front(), fmt::format("{} connections were still proving membership; this, the oldest, "
                                             "was dropped",
                                             pending_.size()));
        pending_.pop_front();
      }
      pending p;
      p.fd = fd;
      p.peer = endpoint_text(address);
      p.deadline = clock::now() + options_.handshake_timeout;
      p.handshaken = options_.tls == nullptr;
      if (options_.tls) {
        auto session = options_.tls->session(fd, true);
        if (!session) {
          refuse(p, session.error().message());
          continue;
        }
        p.tls = std::move(*session);
      }
      pending_.push_back(std::move(p));
      progress(pending_.back());
    }
  }

  // Advances one connection as far as its bytes allow; on success it is
  // handed over, on failure closed (fd = -1 either way).
  void progress(pending& p) {
    std::string why;
    if (!p.handshaken) {
      switch (handshake_step(p.tls.get(), true, why)) {
        case tls_step::done:
          p.handshaken = true;
          break;
        case tls_step::want_read:
          p.events = POLLIN;
          return;
        case tls_step::want_write:
          p.events = POLLOUT;
          return;
        case tls_step::failed:
          refuse(p, why);
          return;
      }
    }
    while (p.received < preamble_size) {
      long n;
      auto* at = p.preamble.data() + p.received;
      auto wanted = preamble_size - p.received; // never more: the rest is BASP's
      if (p.tls) {
        tls_step step;
        n = read_step(p.tls.get(), at, wanted, step, why);
        if (n < 0) {
          refuse(p, fmt::format("{} after {} bytes of the preamble", why, p.received));
          return;
        }
        if (n == 0) {
          p.events = step == tls_step::want_write ? POLLOUT : POLLIN;
          return;
        }
      } else {
        n = ::recv(p.fd, at, wanted, 0);
        if (n == 0) {
          refuse(p, p.received == 0 ? "closed without sending a preamble"
                                    : fmt::format("closed after {} of the preamble's {} bytes", p.received,
                                                  preamble_size));
          return;
        }
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            p.events = POLLIN;
            return;
          }
          refuse(p, fmt::format("read failed: {}", std::strerror(errno)));
          return;
        }
      }
      p.received += static_cast<std::size_t>(n);
      // A stranger usually fails the magic: say so without waiting for 32 bytes.
      if (p.received >= 8 && p.received < preamble_size)
        if (auto ok = check_preamble_start(std::span(p.preamble).first(p.received)); !ok) {
          refuse(p, ok.error().message());
          return;
        }
    }
    if (auto ok = check_preamble(p.preamble, options_.token); !ok) {
      refuse(p, ok.error().message());
      return;
    }
    int fd = p.fd;
    p.fd = -1;
    // The intrusive pointer keeps the doorman alive until the event loop
    // has run this; stop() joins this thread before the doorman can die.
    caf::intrusive_ptr<guarded_doorman> self{this};
    backend_.post([self, fd, tls = std::move(p.tls)]() mutable { self->hand_over(fd, std::move(tls)); });
  }

  void run() {
    std::vector<pollfd> fds;
    while (!stopping_) {
      fds.clear();
      fds.push_back({wake_fd_, POLLIN, 0});
      fds.push_back({listen_fd_, static_cast<short>(paused_ ? 0 : POLLIN), 0});
      auto now = clock::now();
      auto wait = std::chrono::milliseconds(1000);
      for (auto& p : pending_) {
        fds.push_back({p.fd, p.events, 0});
        wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(std::max(p.deadline - now, clock::duration{})));
      }
      if (::poll(fds.data(), fds.size(), static_cast<int>(wait.count())) < 0 && errno != EINTR)
        break;
      if (stopping_)
        break;
      // Pending connections first (their indices match fds[2..]), then new ones.
      now = clock::now();
      for (std::size_t i = 0; i < pending_.size(); ++i) {
        auto& p = pending_[i];
        if (fds[i + 2].revents != 0)
          progress(p);
        if (p.fd >= 0 && now >= p.deadline)
          refuse(p, p.handshaken ? fmt::format("sent {} of the preamble's {} bytes within {} ms", p.received,
                                               preamble_size, options_.handshake_timeout.count())
                                 : fmt::format("did not finish the TLS handshake within {} ms",
                                               options_.handshake_timeout.count()));
      }
      std::erase_if(pending_, [](const pending& p) { return p.fd < 0; });
      if (fds[1].revents != 0)
        accept_new();
      std::erase_if(pending_, [](const pending& p) { return p.fd < 0; });
    }
  }

  net::default_multiplexer& backend_;
  int listen_fd_;
  listener_options options_;
  int wake_fd_;
  std::thread guard_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> paused_{false};
  std::deque<pending> pending_;
  std::uint64_t unreported_ = 0; // refusals since the last log line
  clock::time_point last_log_{};
};

} // namespace

troupe::expected<std::uint16_t> publish(caf::actor_system& system, const caf::actor& whom, std::uint16_t port,
                                        const std::string& address, listener_options options) {
  auto fd = listening_socket(address, port);
  if (!fd)
    return fd.error();
  auto bound = local_port(*fd);
  auto& backend = static_cast<net::default_multiplexer&>(system.middleman().backend());
  caf::io::doorman_ptr doorman = caf::make_counted<guarded_doorman>(backend, *fd, std::move(options));
  auto broker = system.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  std::string failure;
  caf::scoped_actor self{system};
  self
    ->request(broker, std::chrono::seconds(10), caf::publish_atom::value, std::move(doorman), bound,
              caf::actor_cast<caf::strong_actor_ptr>(whom), std::set<std::string>{})
    .receive([] {}, [&](caf::error& err) { failure = system.render(err); });
  if (!failure.empty())
    return make_error(errc::io_error, "cannot publish on port {}: {}", bound, failure);
  return bound;
}

} // namespace troupe::actors::control_plane
