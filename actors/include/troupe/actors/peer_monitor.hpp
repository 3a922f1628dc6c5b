#pragma once
// Failure notification. The registry on the coordinator monitors every
// node's agent and every registered actor; when a node's connection breaks
// (a killed process: milliseconds, through BASP's connection loss; a hung or
// cut-off one: after the heartbeat timeout) it tells every remaining node,
// naming the lost node and the actors it had registered. Every node also
// monitors the registry, so the loss of the coordinator is reported too.
#include <functional>
#include <string>
#include <vector>

namespace troupe::actors {

/// A node that went away without leaving.
struct peer_lost {
  std::string node;                ///< its name, e.g. "worker2"
  std::vector<std::string> actors; ///< its registered actors' places, sorted
  std::string reason;              ///< CAF's rendering of why
};

/// Called on the node's agent thread; keep it short and never block on the
/// node from inside it.
using peer_lost_handler = std::function<void(const peer_lost&)>;

} // namespace troupe::actors
