// The interface a node's data plane is bound to: the one that holds its
// listen address, the loopback interface for any loopback address, none
// (UCX's default: all) for unspecified or malformed addresses.
#include <gtest/gtest.h>

#include "troupe/actors/network_interface.hpp"

namespace troupe::actors {
namespace {

TEST(NetworkInterface, LoopbackAddressesAreTheLoopbackInterface) {
  // Linux names it "lo", also inside a fresh network namespace.
  EXPECT_EQ(interface_for_address("127.0.0.1"), "lo");
  EXPECT_EQ(interface_for_address("127.0.0.7"), "lo"); // all of 127/8
}

TEST(NetworkInterface, UnspecifiedOrMalformedAddressesNameNoInterface) {
  for (const char* address : {"0.0.0.0", "::", "", "localhost", "127.0.0", "not an address", "10.0.0.1 "})
    EXPECT_EQ(interface_for_address(address), "") << "'" << address << "'";
  // A literal that no interface holds (TEST-NET-1, RFC 5737).
  EXPECT_EQ(interface_for_address("192.0.2.1"), "");
}

TEST(NetworkInterface, LoopbackHosts) {
  for (const char* host : {"127.0.0.1", "127.255.0.3", "::1", "localhost"})
    EXPECT_TRUE(is_loopback_address(host)) << host;
  for (const char* host : {"10.0.0.1", "0.0.0.0", "::", "", "example.org", "128.0.0.1"})
    EXPECT_FALSE(is_loopback_address(host)) << host;
}

} // namespace
} // namespace troupe::actors
