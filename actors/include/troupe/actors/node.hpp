#pragma once
// A troupe node: one process's CAF actor system (io middleman, the OpenSSL
// manager when TLS is on, troupe's message types), joined to the job's
// coordinator, with a node agent that spawns actors by factory name and
// reports lost peers.
//
// A program gets its node from the job (troupe/job.hpp), spawns its actors
// on the node's actor system and registers them under a place, where the
// other processes find them.
// From examples/ping_pong.cpp:
//
//   job.start();
//   auto& n = job.node();
//   auto router = n.router();
//   ...
//   auto actor = n.system().spawn([&, name]() -> caf::behavior {
//   ...
//   job.must(n.register_actor(ping, actor), "ping");
//   job.must(n.await_actor(pong, 30s), "ping"); // until rank 1 has registered pong
//
// register_factory / spawn_remote build actors on another node by name.
//
// Threads: the node's methods block the calling thread (they use a scoped
// actor with the node's request timeout) and must not be called from inside
// an actor; actors talk to `agent()` and `registry()` directly with the
// protocols in registry.hpp and below.
//
// Tensors: node::router() (tensor_router.hpp). With TROUPE_TRACE_DIR set,
// start() also starts the process's trace (named after the node, flow ids
// prefixed by its rank), measures the clock offset to the coordinator, and
// stop() flushes the trace.
//
// Agent protocol:
//   (spawn_here, place, factory, args) -> actor   spawn on this node and register
//   (spawn_at, place, factory, args)   -> actor   spawn on place's node (forwards)
//   (deliver, tensor_message)          -> ok      a tensor over CAF (TLS on) for a local actor
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "troupe/actors/node_options.hpp"
#include "troupe/actors/peer_monitor.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

class tensor_router;

/// Makes an actor for a place from the arguments a remote caller sent. Spawn
/// compute actors `detached` so heavy work never blocks CAF's scheduler.
using actor_factory =
  std::function<caf::expected<caf::actor>(caf::actor_system&, const place&, const caf::message&)>;

class node {
public:
  /// Validates the options (TLS files first), starts the actor system, and
  /// joins: rank 0 spawns the registry and listens on the coordinator port;
  /// the others connect to it, retrying until `join_timeout`, and register.
  /// Errors name the node, the coordinator and the cause.
  static troupe::expected<std::unique_ptr<node>> start(node_options options);

  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  /// Leaves the job (no loss is reported for an orderly stop), stops the
  /// actors this node spawned, the agent and the registry, waits until
  /// every actor of the system has stopped (an actor blocked in a collective
  /// stops at its timeout; a message after 2 s, given up after 120 s), and
  /// shuts the actor system down. Idempotent; the destructor calls it.
  /// Actors you spawned yourself must be stopped before.
  void stop();

  caf::actor_system& system() { return *system_; }
  const node_options& options() const { return options_; }
  const std::string& name() const { return options_.name; }
  std::uint32_t rank() const { return options_.rank; }
  /// The port this node listens on (the coordinator port on rank 0).
  std::uint16_t port() const { return port_; }
  caf::actor registry() const { return registry_; }
  caf::actor agent() const { return agent_; }

  /// Makes `factory` available under `name` for spawns on this node.
  /// Register the same factories on every node.
  void register_factory(std::string name, actor_factory factory);

  /// Calls `handler` for every peer lost from now on, until
  /// remove_peer_lost_handler(the returned id).
  std::uint64_t on_peer_lost(peer_lost_handler handler);
  /// Forgets a handler (a pipeline or reducer ring that is gone). A report
  /// already running may still call it once.
  void remove_peer_lost_handler(std::uint64_t id);

  /// Registers `handle` under `where` (its full place string). An actor
  /// of this node stays registered until unregister_actor, or until stop(),
  /// which stops it: a program need not stop its own actors.
  troupe::expected<void> register_actor(const place& where, const caf::actor& handle);
  troupe::expected<void> unregister_actor(const place& where);

  /// Resolves a place string through the registry.
  troupe::expected<caf::actor> lookup(const place& where);
  /// Resolves `where` once it is registered: the registry answers when it
  /// is (one request, no polling); an error after `timeout`, or at once when
  /// the coordinator is gone.
  troupe::expected<caf::actor> await_actor(const place& where, std::chrono::milliseconds timeout);

  /// Spawns `factory` on `where.node` with `args`, registers the actor under
  /// `where` and returns it.
  troupe::expected<caf::actor> spawn_remote(const place& where, const std::string& factory,
                                            caf::message args = {});

  /// Waits until `count` nodes have joined (at most `timeout`).
  troupe::expected<void> wait_for_nodes(std::uint32_t count, std::chrono::milliseconds timeout);

  /// The names of the nodes that joined, sorted.
  troupe::expected<std::vector<std::string>> nodes();

  /// Where a tensor on `from`'s device, sent from `from`, lands at `to`: as
  /// the sending node's device map for the receiving node says, else on the
  /// host (device_map.hpp).
  troupe::expected<troupe::device> landing_device(const place& from, const place& to);

  /// Where tensors go: one call for a place in this process, on another node
  /// over the data plane, or over TLS (tensor_router.hpp). Capture it in the
  /// actors that send; it is null only before start() returned.
  std::shared_ptr<tensor_router> router() const;

  /// Shared between the node and its agent (internal).
  struct state;

private:
  node(node_options options);
  troupe::expected<void> join();
  troupe::expected<void> start_router();
  /// stop(): waits (bounded) until the system's actors have stopped.
  void await_actors_stopped();

  node_options options_;
  std::unique_ptr<caf::actor_system_config> config_;
  std::unique_ptr<caf::actor_system> system_;
  std::shared_ptr<state> state_;
  caf::actor registry_;
  caf::actor agent_;
  std::uint16_t port_ = 0;
  bool stopped_ = false;
  bool traced_ = false; // this node started the process's trace session
};

} // namespace troupe::actors
