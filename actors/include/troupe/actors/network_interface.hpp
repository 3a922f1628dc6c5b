#pragma once
// Which network interface carries a node's data plane.
//
// UCX opens its TCP lanes on every interface it finds unless UCX_NET_DEVICES
// says otherwise: a node listening on 127.0.0.1 still got a second
// rendezvous lane to the machine's external address (UCX's debug log
// shows it). A job bound to loopback must
// not reach any other address, so a node gives its data plane the interface
// that holds its listen address (node.cpp), unless UCX_NET_DEVICES is set.
#include <string>
#include <string_view>

namespace troupe::actors {

/// Whether `host` is a loopback address: 127.0.0.0/8, ::1 or "localhost".
bool is_loopback_address(std::string_view host);

/// The name of the interface that holds `address` (an IPv4 or IPv6 literal):
/// "lo" for 127.0.0.1, or for any 127.x.y.z or ::1 (the loopback
/// interface), "eth0" for that interface's own address. Empty when the
/// address is unspecified (0.0.0.0, ::), not a literal, or on no interface.
std::string interface_for_address(std::string_view address);

} // namespace troupe::actors
