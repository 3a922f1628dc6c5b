#pragma once
// The name registry: one actor on the coordinator (rank 0), published on the
// coordinator port, that maps place strings (`worker1/cpu/stage0`) to actor
// handles and node names to node agents.
//
// Protocol (atoms in message_types.hpp; every caller uses a finite timeout):
//   (reg_node, name, agent, device_maps)  -> string  join, replies the coordinator's
//                                                    name; device_maps maps a
//                                                    destination node name to
//                                                    device_map text
//   (leave, name)                         -> ok      orderly departure, no
//                                                    loss is reported
//   (reg_name, place, actor)              -> ok      error if taken
//   (unreg_name, place)                   -> ok
//   (lookup_name, place)                  -> actor   error if unknown
//   (lookup_node, name)                   -> agent   error if unknown
//   (list_nodes)                          -> vector<string>
//   (await_nodes, n)                      -> ok      once n nodes joined
//   (device_map, from_node, to_node)      -> string  device_map text
//   (job_token)                           -> uint64  the data plane's per-job token
//   (clock)                               -> int64   coordinator's system clock, ns
//   (data_address, name, address)         -> ok      publish a node's UCX address
//   (data_address, name)                  -> string  error until published
// and it sends (node_lost, name, actors, reason) to every remaining agent
// when a node's connection breaks.
#include <cstdint>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace troupe::actors {

/// Spawns the registry in `system` (the coordinator's node does this).
/// `job_token` is what every node's data plane stamps into its frames.
caf::actor spawn_registry(caf::actor_system& system, std::string coordinator_name,
                          std::uint64_t job_token = 0);

} // namespace troupe::actors
