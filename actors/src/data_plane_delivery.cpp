#include "troupe/actors/data_plane_delivery.hpp"

#include <caf/send.hpp>
#include <fmt/format.h>

namespace troupe::actors {

receive_handler deliver_to_actors(actor_lookup lookup, std::string node_name) {
  return [lookup = std::move(lookup), node_name = std::move(node_name)](peer_id from,
                                                                        tensor_message&& message) {
    auto destination = lookup(message.meta.destination);
    if (!destination) {
      fmt::print(stderr,
                 "troupe data plane [{}]: dropped a message from peer {}: no actor named '{}'\n",
                 node_name, from, message.meta.destination);
      return;
    }
    caf::anon_send(destination, std::move(message));
  };
}

} // namespace troupe::actors
