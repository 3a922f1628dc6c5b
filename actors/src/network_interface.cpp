#include "troupe/actors/network_interface.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>

namespace troupe::actors {

namespace {

/// An IPv4 or IPv6 literal, parsed (neither: not a literal).
struct ip_literal {
  bool v4 = false, v6 = false;
  in_addr a4{};
  in6_addr a6{};

  explicit ip_literal(std::string_view text) {
    const std::string s(text);
    v4 = ::inet_pton(AF_INET, s.c_str(), &a4) == 1;
    v6 = !v4 && ::inet_pton(AF_INET6, s.c_str(), &a6) == 1;
  }
  /// All of 127.0.0.0/8 is loopback, though the interface lists only
  /// 127.0.0.1/8.
  bool loopback() const { return (v4 && (ntohl(a4.s_addr) >> 24) == 127) || (v6 && IN6_IS_ADDR_LOOPBACK(&a6)); }
  bool unspecified() const { return (v4 && a4.s_addr == htonl(INADDR_ANY)) || (v6 && IN6_IS_ADDR_UNSPECIFIED(&a6)); }
};

} // namespace

bool is_loopback_address(std::string_view host) {
  return host == "localhost" || ip_literal(host).loopback();
}

std::string interface_for_address(std::string_view address) {
  const ip_literal ip(address);
  if ((!ip.v4 && !ip.v6) || ip.unspecified())
    return {};
  const bool loopback = ip.loopback();
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    return {};
  std::string found;
  for (const ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_name == nullptr)
      continue;
    if (loopback) {
      if ((i->ifa_flags & IFF_LOOPBACK) != 0)
        found = i->ifa_name;
      continue;
    }
    if (ip.v4 && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == ip.a4.s_addr)
      found = i->ifa_name;
    if (ip.v6 && i->ifa_addr->sa_family == AF_INET6 &&
        std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, &ip.a6, sizeof ip.a6) == 0)
      found = i->ifa_name;
  }
  ::freeifaddrs(list);
  return found;
}

} // namespace troupe::actors
