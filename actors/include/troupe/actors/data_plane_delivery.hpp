#pragma once
// The CAF side of the data plane: delivering received tensors to actors.
#include <functional>
#include <string>

#include <caf/actor.hpp>

#include "troupe/actors/data_plane_options.hpp"

namespace troupe::actors {

/// Finds the local actor registered under a destination name (an invalid
/// caf::actor when there is none).
using actor_lookup = std::function<caf::actor(const std::string& destination)>;

/// A receive handler that hands each message to the actor `lookup` finds for
/// its `meta.destination` as an ordinary local CAF message (anon_send), so
/// actor code never sees which plane carried it. A message for an unknown
/// destination is dropped with one logged line.
receive_handler deliver_to_actors(actor_lookup lookup, std::string node_name = {});

} // namespace troupe::actors
