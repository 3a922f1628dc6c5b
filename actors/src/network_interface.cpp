#include "troupe/actors/network_interface.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>

namespace troupe::actors {

bool is_loopback_address(std::string_view host) {
  if (host == "localhost")
    return true;
  const std::string text(host);
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1)
    return (ntohl(v4.s_addr) >> 24) == 127;
  return ::inet_pton(AF_INET6, text.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::string interface_for_address(std::string_view address) {
  const std::string text(address);
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = ::inet_pton(AF_INET, text.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && ::inet_pton(AF_INET6, text.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6)
    return {};
  if ((is_v4 && v4.s_addr == htonl(INADDR_ANY)) || (is_v6 && IN6_IS_ADDR_UNSPECIFIED(&v6)))
    return {};
  // All of 127.0.0.0/8 is loopback, though the interface lists only
  // 127.0.0.1/8.
  const bool loopback = (is_v4 && (ntohl(v4.s_addr) >> 24) == 127) || (is_v6 && IN6_IS_ADDR_LOOPBACK(&v6));
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
    if (is_v4 && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == v4.s_addr)
      found = i->ifa_name;
    if (is_v6 && i->ifa_addr->sa_family == AF_INET6 &&
        std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, &v6, sizeof v6) == 0)
      found = i->ifa_name;
  }
  ::freeifaddrs(list);
  return found;
}

} // namespace troupe::actors
