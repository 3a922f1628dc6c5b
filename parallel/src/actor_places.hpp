#pragma once
// Places served by a function: how parallel/'s actors without a mailbox hop
// (parameter-server shards and clients, remote-module hosts and callers)
// register themselves, wait for each other and send what they answer.
#include <functional>
#include <string>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/actor.hpp>

#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_message.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel::detail {

/// "worker1" of "worker1/cpu/ps0".
std::string node_of(const std::string& place_text);

/// Registers `where` on the node as an actor whose messages go to `sink`,
/// and as a router sink (no thread hand-off on delivery).
expected<caf::actor> attach_place(actors::node& node, const std::string& where,
                                  std::function<void(const actors::tensor_message&)> sink);

/// Undoes attach_place (idempotent: `handle` is reset).
void detach_place(actors::node& node, const std::string& where, caf::actor& handle);

/// Waits (at most `timeout` in all) until every place is registered.
expected<void> await_places(actors::node& node, const std::vector<std::string>& places,
                            std::chrono::milliseconds timeout);

/// A tensor for another node: in this node's shared arena when it is large
/// enough that the router would copy it there anyway (a same-host receiver
/// then maps it: no copy at all), on the heap otherwise or when the arena
/// is full or absent.
tensor outgoing_tensor(actors::tensor_router& router, const dims& shape, dtype type);

/// A message with these header fields.
actors::tensor_message make_message(message_kind kind, std::uint64_t step, std::uint32_t micro_batch,
                                    std::uint64_t context, tensor value);

} // namespace troupe::parallel::detail
