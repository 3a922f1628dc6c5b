// The handshake deadline in front of UCX's TCP listener
// (actors/src/ucx_handshake_deadline.hpp): a connection that has not sent
// UCX's connection handshake within the deadline is shut down, one that has
// is never touched, the number pending is bounded, and a data plane keeps
// serving its peers while strangers' silent connections are closed.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "troupe/actors/data_plane.hpp"
#include "troupe/tensor/tensor.hpp"
#include "ucx_handshake_deadline.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::actors;
using detail::handshake_deadline_options;
using detail::listening_tcp_sockets;
using detail::ucx_handshake_deadline;

namespace {

/// A file descriptor closed on scope exit.
struct fd_guard {
  int fd = -1;
  explicit fd_guard(int f) : fd(f) {}
  fd_guard(fd_guard&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  ~fd_guard() {
    if (fd >= 0)
      ::close(fd);
  }
};

/// A loopback listener standing in for UCX's: bound to an ephemeral port.
fd_guard listen_on_loopback(std::uint16_t& port) {
  fd_guard s(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(s.fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  EXPECT_EQ(::listen(s.fd, 64), 0);
  socklen_t length = sizeof address;
  ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&address), &length);
  port = ntohs(address.sin_port);
  return s;
}

fd_guard connect_to(std::uint16_t port) {
  fd_guard s(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  EXPECT_EQ(::connect(s.fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  return s;
}

/// Whether the other side has closed `fd` (a read sees end of stream),
/// waiting at most `wait`.
bool closed_by_peer(int fd, std::chrono::milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0)
    return false;
  char byte = 0;
  return ::recv(fd, &byte, 1, MSG_DONTWAIT) == 0;
}

std::uint16_t local_port(int fd) {
  sockaddr_in address{};
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  return ntohs(address.sin_port);
}

} // namespace

TEST(UcxHandshakeDeadline, ListeningSocketsAreFoundByInodeAndPort) {
  auto before = listening_tcp_sockets();
  std::uint16_t port = 0;
  auto listener = listen_on_loopback(port);
  auto after = listening_tcp_sockets();
  std::set<std::uint16_t> new_ports;
  for (auto& [inode, p] : after)
    if (!before.contains(inode))
      new_ports.insert(p);
  EXPECT_EQ(new_ports, std::set<std::uint16_t>{port});
  // A connected socket is not a listener.
  auto client = connect_to(port);
  for (auto& [inode, p] : listening_tcp_sockets())
    EXPECT_NE(p, local_port(client.fd));
}

TEST(UcxHandshakeDeadline, SilentConnectionsAreShutDownAfterTheDeadlineOnly) {
  std::uint16_t port = 0;
  auto listener = listen_on_loopback(port);
  handshake_deadline_options options;
  options.deadline = 2s;
  ucx_handshake_deadline deadline({port}, options);

  auto silent = connect_to(port);
  auto talker = connect_to(port);
  fd_guard silent_accepted(::accept(listener.fd, nullptr, nullptr));
  fd_guard talker_accepted(::accept(listener.fd, nullptr, nullptr));
  std::vector<char> handshake(options.handshake_bytes, 'x');
  ASSERT_EQ(::send(talker.fd, handshake.data(), handshake.size(), 0),
            static_cast<ssize_t>(handshake.size()));
  std::this_thread::sleep_for(50ms); // the bytes reach the accepted socket

  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(deadline.sweep(t0).empty());
  EXPECT_EQ(deadline.pending(), 1u); // the silent one; the talker is past the handshake
  EXPECT_TRUE(deadline.sweep(t0 + 1900ms).empty());
  EXPECT_FALSE(closed_by_peer(silent.fd, 0ms));

  auto swept = deadline.sweep(t0 + 2s);
  ASSERT_EQ(swept.size(), 1u);
  EXPECT_EQ(swept[0].peer, "127.0.0.1:" + std::to_string(local_port(silent.fd)));
  EXPECT_NE(swept[0].reason.find("sent 0 bytes in 2000 ms"), std::string::npos) << swept[0].reason;
  EXPECT_TRUE(closed_by_peer(silent.fd, 1s));
  EXPECT_FALSE(closed_by_peer(talker.fd, 100ms));
  // Shut down once: a later sweep neither reports it again nor touches the talker.
  EXPECT_TRUE(deadline.sweep(t0 + 10s).empty());
  EXPECT_EQ(deadline.pending(), 0u);
  EXPECT_FALSE(closed_by_peer(talker.fd, 100ms));
}

TEST(UcxHandshakeDeadline, SlowClientsAreJudgedByBytesNotActivity) {
  std::uint16_t port = 0;
  auto listener = listen_on_loopback(port);
  handshake_deadline_options options;
  options.deadline = 1s;
  ucx_handshake_deadline deadline({port}, options);
  auto slow = connect_to(port);
  fd_guard accepted(::accept(listener.fd, nullptr, nullptr));
  auto t0 = std::chrono::steady_clock::now();
  // A byte at every sweep keeps it busy but never completes a handshake.
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(::send(slow.fd, "x", 1, 0), 1);
    std::this_thread::sleep_for(20ms);
    auto swept = deadline.sweep(t0 + i * 300ms);
    if (!swept.empty()) {
      EXPECT_GE(i * 300ms, 1s);
      EXPECT_NE(swept[0].reason.find("less than UCX's connection handshake"), std::string::npos);
      EXPECT_TRUE(closed_by_peer(slow.fd, 1s));
      return;
    }
  }
  FAIL() << "a client dripping bytes was never shut down";
}

TEST(UcxHandshakeDeadline, PendingConnectionsAreBoundedOldestFirst) {
  std::uint16_t port = 0;
  auto listener = listen_on_loopback(port);
  handshake_deadline_options options;
  options.deadline = 60s;
  options.max_pending = 3;
  ucx_handshake_deadline deadline({port}, options);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<fd_guard> clients, accepted;
  for (int i = 0; i < 5; ++i) {
    clients.push_back(connect_to(port));
    accepted.emplace_back(::accept(listener.fd, nullptr, nullptr));
    // Each is first seen at its own sweep, so age orders them.
    auto swept = deadline.sweep(t0 + i * 10ms);
    if (i < 3) {
      EXPECT_TRUE(swept.empty()) << i;
    } else {
      ASSERT_EQ(swept.size(), 1u) << i;
      EXPECT_EQ(swept[0].peer, "127.0.0.1:" + std::to_string(local_port(clients[i - 3].fd)));
      EXPECT_NE(swept[0].reason.find("more than 3 connections"), std::string::npos);
    }
  }
  EXPECT_EQ(deadline.pending(), 3u);
  EXPECT_TRUE(closed_by_peer(clients[0].fd, 1s));
  EXPECT_TRUE(closed_by_peer(clients[1].fd, 1s));
  for (int i = 2; i < 5; ++i)
    EXPECT_FALSE(closed_by_peer(clients[i].fd, 50ms)) << i;
}

TEST(UcxHandshakeDeadline, ConnectionsClosedByTheirOwnerAreForgotten) {
  std::uint16_t port = 0;
  auto listener = listen_on_loopback(port);
  ucx_handshake_deadline deadline({port});
  auto client = connect_to(port);
  {
    fd_guard accepted(::accept(listener.fd, nullptr, nullptr));
    deadline.sweep(std::chrono::steady_clock::now());
    EXPECT_EQ(deadline.pending(), 1u);
  }
  EXPECT_TRUE(deadline.sweep(std::chrono::steady_clock::now() + 1h).empty());
  EXPECT_EQ(deadline.pending(), 0u);
}

TEST(UcxHandshakeDeadline, ADataPlaneClosesSilentStrangersAndKeepsServingPeers) {
  std::atomic<int> received{0};
  auto options_for = [&](const char* name) {
    data_plane_options options;
    options.node_name = name;
    options.token = 0x5eed5eed12345678ull;
    options.transports = "tcp"; // UCX's TCP listener is the socket under test
    options.net_devices = "lo";
    options.handshake_deadline = 500ms;
    options.on_receive = [&](peer_id, tensor_message&&) { ++received; };
    return options;
  };
  auto before = listening_tcp_sockets();
  auto server = data_plane::start(options_for("server"));
  ASSERT_TRUE(server) << server.error().to_string();
  std::set<std::uint16_t> ucx_ports;
  for (auto& [inode, port] : listening_tcp_sockets())
    if (!before.contains(inode))
      ucx_ports.insert(port);
  ASSERT_FALSE(ucx_ports.empty()) << "UCX opened no TCP listener";

  std::vector<fd_guard> strangers;
  for (auto port : ucx_ports)
    for (int i = 0; i < 4; ++i)
      strangers.push_back(connect_to(port));
  // Deadline 0.5 s, sweeps once a second: every stranger closed within 3 s.
  for (auto& s : strangers)
    EXPECT_TRUE(closed_by_peer(s.fd, 3s)) << "a silent connection to UCX's port stayed open";
  // Counted right after the shutdown (the strangers may see it first).
  auto counted = std::chrono::steady_clock::now() + 2s;
  while ((*server)->stats().silent_connections_closed < strangers.size() &&
         std::chrono::steady_clock::now() < counted)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ((*server)->stats().silent_connections_closed, strangers.size());

  // A real peer connects after (and while) strangers are being closed.
  auto more = connect_to(*ucx_ports.begin());
  auto client = data_plane::start(options_for("client"));
  ASSERT_TRUE(client) << client.error().to_string();
  auto to_server = (*client)->connect("server", (*server)->address());
  ASSERT_TRUE(to_server) << to_server.error().to_string();
  for (int i = 0; i < 10; ++i) {
    tensor_message m;
    m.meta.destination = "sink";
    m.meta.step = static_cast<std::uint64_t>(i);
    m.value = tensor::zeros({256});
    ASSERT_TRUE((*client)->send(*to_server, std::move(m)));
  }
  auto until = std::chrono::steady_clock::now() + 10s;
  while (received < 10 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(received.load(), 10);
  EXPECT_TRUE(closed_by_peer(more.fd, 3s));
  // The peer's own connection was left alone: it still delivers.
  std::this_thread::sleep_for(1500ms); // past a sweep after the deadline
  tensor_message m;
  m.meta.destination = "sink";
  m.value = tensor::zeros({256});
  ASSERT_TRUE((*client)->send(*to_server, std::move(m)));
  until = std::chrono::steady_clock::now() + 10s;
  while (received < 11 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(received.load(), 11);
  (*client)->close();
  (*server)->close();
}
