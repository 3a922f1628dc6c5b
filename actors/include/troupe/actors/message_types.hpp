#pragma once
// Every message type and atom of troupe's control plane, and the one function
// that registers them. Every node calls `add_message_types` on its config
// (node does it for you): a type missing on the receiver arrives as an empty
// message, so registration lives in exactly one place.
//
// Atoms carry a `t_` prefix: CAF 0.17 predefines get_atom, ok_atom,
// spawn_atom and others in namespace caf, and a second definition with the
// same text would be the same atom.
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>

namespace troupe::actors {

// Registry protocol (the registry actor on the coordinator, see registry.hpp).
using reg_node_atom = caf::atom_constant<caf::atom("t_regnode")>;
using leave_atom = caf::atom_constant<caf::atom("t_leave")>;
using reg_name_atom = caf::atom_constant<caf::atom("t_regname")>;
using unreg_name_atom = caf::atom_constant<caf::atom("t_unreg")>;
using lookup_name_atom = caf::atom_constant<caf::atom("t_lookup")>;
using lookup_node_atom = caf::atom_constant<caf::atom("t_lookupn")>;
using list_nodes_atom = caf::atom_constant<caf::atom("t_nodes")>;
using await_nodes_atom = caf::atom_constant<caf::atom("t_await")>;
using await_name_atom = caf::atom_constant<caf::atom("t_awaitnm")>; // (place, timeout ms) -> actor, once registered
using waiting_atom = caf::atom_constant<caf::atom("t_waiting")>;   // (await_name, waiting) -> uint64 kept requests
using device_map_atom = caf::atom_constant<caf::atom("t_devmap")>;
using node_lost_atom = caf::atom_constant<caf::atom("t_lost")>;
using joined_atom = caf::atom_constant<caf::atom("t_joined")>;

// Node agent protocol (one agent per node, see node.hpp).
using spawn_here_atom = caf::atom_constant<caf::atom("t_spawn")>;
using spawn_at_atom = caf::atom_constant<caf::atom("t_spawnat")>;

// Job-wide facts kept by the registry (node.cpp reads them at join).
using job_token_atom = caf::atom_constant<caf::atom("t_token")>;   // -> uint64 data-plane token
using clock_atom = caf::atom_constant<caf::atom("t_clock")>;       // -> int64 system-clock ns
using data_address_atom = caf::atom_constant<caf::atom("t_dpaddr")>; // (node, address) -> ok; (node) -> address

// Tensor routing (tensor_router.hpp).
using deliver_atom = caf::atom_constant<caf::atom("t_deliver")>; // (tensor_message) -> ok
using route_atom = caf::atom_constant<caf::atom("t_route")>;     // (node): resolve and drain

constexpr reg_node_atom reg_node_atom_v{};
constexpr job_token_atom job_token_atom_v{};
constexpr clock_atom clock_atom_v{};
constexpr data_address_atom data_address_atom_v{};
constexpr deliver_atom deliver_atom_v{};
constexpr route_atom route_atom_v{};
constexpr leave_atom leave_atom_v{};
constexpr reg_name_atom reg_name_atom_v{};
constexpr unreg_name_atom unreg_name_atom_v{};
constexpr lookup_name_atom lookup_name_atom_v{};
constexpr lookup_node_atom lookup_node_atom_v{};
constexpr list_nodes_atom list_nodes_atom_v{};
constexpr await_nodes_atom await_nodes_atom_v{};
constexpr await_name_atom await_name_atom_v{};
constexpr waiting_atom waiting_atom_v{};
constexpr device_map_atom device_map_atom_v{};
constexpr node_lost_atom node_lost_atom_v{};
constexpr joined_atom joined_atom_v{};
constexpr spawn_here_atom spawn_here_atom_v{};
constexpr spawn_at_atom spawn_at_atom_v{};

/// Registers troupe's message types (tensor_message, ...) and its error
/// category on `config`. Call it once per config, on every node.
void add_message_types(caf::actor_system_config& config);

} // namespace troupe::actors
