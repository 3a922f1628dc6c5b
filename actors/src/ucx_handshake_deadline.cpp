#include "ucx_handshake_deadline.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

namespace troupe::actors::detail {

namespace {

// The kernel's TCP states (include/net/tcp_states.h); <linux/tcp.h>, whose
// tcp_info has tcpi_bytes_received, does not name them.
constexpr std::uint8_t tcp_established = 1;
constexpr std::uint8_t tcp_close_wait = 8;

/// A TCP socket of this process as the sweep sees it.
struct socket_view {
  int fd;
  std::uint64_t inode;
  std::uint16_t local_port;
  bool listening;
};

std::string address_text(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    auto& in = reinterpret_cast<const sockaddr_in&>(address);
    ::inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
    return fmt::format("{}:{}", text, ntohs(in.sin_port));
  }
  if (address.ss_family == AF_INET6) {
    auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
    return fmt::format("[{}]:{}", text, ntohs(in6.sin6_port));
  }
  return "an address of family " + std::to_string(address.ss_family);
}

std::uint16_t port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  if (address.ss_family == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  return 0;
}

/// Calls `visit` for every IPv4/IPv6 TCP socket among this process's
/// descriptors. Descriptors are only inspected, never kept open.
template <class Visit> void for_each_tcp_socket(Visit&& visit) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir)
    return;
  int own = ::dirfd(dir);
  while (auto* entry = ::readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own)
      continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode))
      continue;
    int type = 0, protocol = 0, accepting = 0;
    socklen_t length = sizeof type;
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &length) != 0 ||
        type != SOCK_STREAM)
      continue;
    length = sizeof protocol;
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_PROTOCOL, &protocol, &length) != 0 ||
        protocol != IPPROTO_TCP)
      continue;
    sockaddr_storage local{};
    length = sizeof local;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &length) != 0)
      continue;
    auto port = port_of(local);
    if (port == 0)
      continue;
    length = sizeof accepting;
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &accepting, &length) != 0)
      continue;
    visit(socket_view{static_cast<int>(fd), static_cast<std::uint64_t>(st.st_ino), port,
                      accepting != 0});
  }
  ::closedir(dir);
}

} // namespace

std::map<std::uint64_t, std::uint16_t> listening_tcp_sockets() {
  std::map<std::uint64_t, std::uint16_t> found;
  for_each_tcp_socket([&](const socket_view& s) {
    if (s.listening)
      found.emplace(s.inode, s.local_port);
  });
  return found;
}

ucx_handshake_deadline::ucx_handshake_deadline(std::set<std::uint16_t> ports,
                                               handshake_deadline_options options)
    : ports_(std::move(ports)), options_(options) {}

std::vector<swept_connection> ucx_handshake_deadline::sweep(clock_type::time_point now) {
  std::vector<swept_connection> swept;
  if (ports_.empty())
    return swept;
  std::map<std::uint64_t, pending_connection> still_pending;
  for_each_tcp_socket([&](const socket_view& s) {
    if (s.listening || !ports_.contains(s.local_port))
      return;
    tcp_info info{};
    socklen_t length = sizeof info;
    if (::getsockopt(s.fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0)
      return;
    // Only live connections: one already shut down is UCX's to close.
    if (info.tcpi_state != tcp_established && info.tcpi_state != tcp_close_wait)
      return;
    if (info.tcpi_bytes_received >= options_.handshake_bytes)
      return; // past UCX's handshake: a peer's connection, UCX's to judge
    if (auto known = pending_.find(s.inode); known != pending_.end()) {
      known->second.fd = s.fd;
      known->second.bytes_received = info.tcpi_bytes_received;
      still_pending.insert(*known);
      return;
    }
    sockaddr_storage peer{};
    length = sizeof peer;
    std::string peer_text = ::getpeername(s.fd, reinterpret_cast<sockaddr*>(&peer), &length) == 0
                                ? address_text(peer)
                                : std::string("an unknown peer");
    still_pending.emplace(s.inode, pending_connection{s.fd, now, info.tcpi_bytes_received,
                                                      std::move(peer_text)});
  });
  pending_ = std::move(still_pending);

  // Oldest first, so the pending bound evicts the longest-waiting.
  std::vector<std::map<std::uint64_t, pending_connection>::iterator> order;
  for (auto it = pending_.begin(); it != pending_.end(); ++it)
    order.push_back(it);
  std::sort(order.begin(), order.end(),
            [](auto a, auto b) { return a->second.first_seen < b->second.first_seen; });
  std::size_t over = order.size() > options_.max_pending ? order.size() - options_.max_pending : 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    auto it = order[i];
    auto& c = it->second;
    bool late = now - c.first_seen >= options_.deadline;
    if (!late && i >= over)
      continue;
    // The descriptor may have been closed (and its number reused) since the
    // scan: shut it down only if it is still the same socket.
    struct stat st {};
    if (::fstat(c.fd, &st) != 0 || static_cast<std::uint64_t>(st.st_ino) != it->first) {
      pending_.erase(it);
      continue;
    }
    ::shutdown(c.fd, SHUT_RDWR);
    swept.push_back(
        {c.peer, late ? fmt::format("sent {} bytes in {} ms, less than UCX's connection handshake",
                                    c.bytes_received, options_.deadline.count())
                      : fmt::format("more than {} connections were waiting for UCX's handshake",
                                    options_.max_pending)});
    pending_.erase(it);
  }
  return swept;
}

} // namespace troupe::actors::detail
