#pragma once
// One way to send a tensor to a place, whichever plane carries it
// (docs/design.md, "The two planes"). Every node owns one router (node::router()).
//
// The sending side, and the destination actor, registered under its place
// (spawn_remote or node::register_actor), which receives an ordinary actor
// message.
// From examples/ping_pong.cpp:
//
//   auto router = n.router();
//   ...
//   job.must(router->send(pong, std::move(m), {}, name), "ping");
//   ...
//   return {[router, ping, name](const tensor_message& m) {
//   tensor_receive_scope scope(name, m);
//
// send() refuses at once (lost peer, back-pressure) rather than queueing
// without bound; the optional callback reports when the send completed.
//
// Which plane:
//   destination in this process  a local CAF message; the handler sees the same
//                                tensor storage (zero copy, only a reference count changes)
//   another process, TLS off     the node's UCX data plane (shared memory, CMA, TCP or
//                                verbs, UCX's choice); the receiving node hands the
//                                tensor to the actor as a local CAF message
//   another process on this      by reference when the tensor lies in this node's shared
//   host, TLS off                arena (allocate it with arena_tensor()): only the arena
//                                name, offset, length and header travel (a small data-plane
//                                frame); the receiver maps the region and its tensor aliases
//                                it, no byte is copied. A heap tensor of at least
//                                `copy_into_arena_min_bytes` is first copied into the arena
//                                (when that beats UCX's shared memory, see bench/transport),
//                                otherwise it goes through UCX; an arena without room falls
//                                back to UCX, never waits.
//
// Same-host tensors, step by step:
//  1. The sender's router shares the region (shared_arena::share_region) and
//     records it as lent to the destination node (arena_loans); the data
//     plane sends the arena frame in order with that node's other messages.
//  2. The receiver's data plane checks the frame's sizes, header and token;
//     its router maps the arena (arena_mapper::open checks the region
//     against the mapping and the header) and delivers the tensor.
//  3. When the last view of the received tensor goes (in any thread of the
//     receiving process) a release frame goes back to the owner.
//  4. The owner's router ends the loan (a release that matches no loan to
//     that node is refused and logged) and the arena frees the region once
//     the sender's own tensor is gone too. A lost node's loans all end at
//     once; a handoff whose send fails ends its loan at once.
// Same host means the same kernel boot and the same /dev/shm (the host key
// each router publishes with its data-plane address).
//   another process, TLS on      CAF's mutually authenticated TLS connection (BASP with
//                                tensor_message's validating inspect), because UCX does
//                                not encrypt: with TLS on no payload leaves the process
//                                in the clear and the data plane is not even started
//
// Devices. Both planes carry host memory: a device tensor leaving the
// process is staged through the host. Where the sending node's device map
// for the destination node lists the tensor's device, the receiving router
// moves it onto the listed device before the actor sees it (on the thread
// that delivers it); otherwise it arrives on the host. A tensor that cannot
// be placed there (no such device at the receiver, out of memory) is
// delivered on the host with an error on stderr, never dropped. In-process
// sends keep the tensor where it is.
//
// Thread model. send() may be called from any thread, including an
// event-based actor's handler: it never blocks on the network or on the
// registry. A send to a node not yet connected waits in a bounded queue while
// the router's own (detached) actor asks the registry for the node's data-plane
// address and connects; later sends go straight to the data plane. Every queue
// is bounded: beyond `max_queued_sends` per node send() refuses with
// errc::size_limit_exceeded (back-pressure; retry after a completion). The
// completion runs once per accepted send, on the data plane's thread or the
// router's actor thread: ok when the message left (data plane) or was handed
// to the destination node (TLS), an error naming the node otherwise. A
// device tensor's copy to the host is waited for on a staging thread of the
// router's own (started by the first such send), never on the sender's or
// the actor's; its sends, and those queued behind them for the same node,
// go on in order once it is on the host.
//
// Failure. When the control plane reports a lost node (on_peer_lost) the
// router disconnects its data-plane endpoint, fails what was queued for it,
// and refuses later sends with errc::io_error "node <name> was lost: ...".
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "troupe/actors/data_plane.hpp"
#include "troupe/actors/device_map.hpp"
#include "troupe/actors/peer_monitor.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/actors/shared_arena.hpp"
#include "troupe/actors/tensor_message.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::actors {

/// Counters since start; snapshot by tensor_router::stats().
struct tensor_router_stats {
  std::uint64_t local_sends = 0;         ///< delivered in process (zero copy)
  std::uint64_t data_plane_sends = 0;    ///< handed to UCX
  std::uint64_t control_plane_sends = 0; ///< sent over CAF (TLS on)
  std::uint64_t refused = 0;             ///< send() returned an error
  std::uint64_t remote_deliveries = 0;   ///< tensors from other nodes handed to local actors
  std::uint64_t undeliverable = 0;       ///< arrived for a place nobody registered
  std::uint64_t arena_sends = 0;         ///< handed to a same-host node by reference
  std::uint64_t arena_copies = 0;        ///< heap tensors copied into the arena to go by reference
  std::uint64_t arena_fallbacks = 0;     ///< arena full: went through UCX instead
  std::uint64_t arena_receives = 0;      ///< tensors received by reference
  std::uint64_t arena_refused = 0;       ///< handoffs or releases from peers that failed validation
  std::uint64_t landings = 0;            ///< tensors moved onto the device a sender's device map named
  std::uint64_t landing_failures = 0;    ///< ... that could not be moved there and were delivered on the host
};

struct tensor_router_options {
  std::string node_name;
  caf::actor registry;
  std::chrono::milliseconds request_timeout{10000};
  /// No data plane: tensors to other nodes go over CAF's connections
  /// (encrypted when TLS is on, the reason to choose this), and a
  /// one-process job opens no UCX listener.
  bool without_data_plane = false;
  /// The data plane's settings (node name, token and on_receive are filled in).
  data_plane_options data_plane;
  /// Sends queued per node while it is being resolved (or in flight over TLS).
  std::size_t max_queued_sends = 256;
  /// Size of this node's shared arena for same-host tensors (POSIX shared
  /// memory, pages used only when touched); 0: no arena, same-host tensors
  /// go through UCX.
  std::size_t arena_bytes = std::size_t{1} << 30;
  /// Heap tensors of at least this many bytes for a same-host node are
  /// copied into the arena and handed over by reference; smaller ones (and
  /// all when SIZE_MAX) go through UCX's shared memory. From 64 KiB one
  /// memcpy into the arena beats UCX's shared memory (bench/transport's
  /// "same host" rows); below, UCX sends eagerly and the handoff's fixed
  /// cost dominates. Figures: docs/performance.md, "Figures behind defaults".
  std::size_t copy_into_arena_min_bytes = std::size_t{64} << 10;
  /// Which host this node is on (empty: this kernel's boot id and /dev/shm);
  /// nodes with equal keys exchange tensors by reference.
  std::string host_key;
  /// Per destination node, where its actors receive this node's tensors
  /// (device_map.hpp; `--troupe.device-map.<node>`). The receiving router
  /// moves the tensor there before an actor sees it; sinks (attach_sink)
  /// get it on the host, as the plane carried it.
  std::map<std::string, device_map> device_maps;
};

class tensor_router : public std::enable_shared_from_this<tensor_router> {
public:
  struct impl;

  /// Starts the data plane (unless encrypted) and the router's actor.
  static expected<std::shared_ptr<tensor_router>> start(caf::actor_system& system,
                                                        tensor_router_options options);
  ~tensor_router();
  tensor_router(const tensor_router&) = delete;
  tensor_router& operator=(const tensor_router&) = delete;

  /// Sends `message` to the actor registered under `to` (a full place,
  /// `worker1/cpu/stage1`); sets `message.meta.destination` to it and gives
  /// the message a trace flow id when tracing and it has none. `sender` names
  /// the sending actor in the trace ({}: untraced sender). Never blocks.
  /// Errors (and then `done` is not called): the place has no name, the
  /// destination's node was lost, the router stopped, back-pressure.
  expected<void> send(const place& to, tensor_message message, completion_callback done = {},
                      trace::name_id sender = {});

  /// Makes a local actor reachable under `where` (node does this for the
  /// actors it spawns and registers), or forgets it.
  void attach(const std::string& where, caf::actor handle);
  void detach(const std::string& where);

  /// A place served by a function instead of an actor's mailbox: tensors for
  /// `where` (from this process or delivered from another node) are handed
  /// to `sink` on the sending or delivering thread (often the data plane's
  /// transport thread), saving a thread hand-off per message. The sink must
  /// be quick and must not block or throw (file the tensor and wake its
  /// consumer, as the reducer ring does). Takes precedence over an actor
  /// attached under the same place; detach() removes it.
  using tensor_sink = std::function<void(tensor_message)>;
  void attach_sink(const std::string& where, tensor_sink sink);

  /// Hands a tensor that arrived from another node to its local actor.
  void deliver(tensor_message message);

  /// The control plane lost `lost.node`: disconnect it and fail its sends.
  void on_peer_lost(const peer_lost& lost);

  /// An uninitialised contiguous tensor in this node's shared arena: sent to
  /// a node on the same host it goes by reference (no copy), anywhere else
  /// like any tensor. errc::size_limit_exceeded when the arena has no room
  /// (allocate on the heap instead, or retry when receivers have released
  /// theirs); errc::invalid_argument when the node has no arena (TLS on, or
  /// arena_bytes = 0).
  expected<tensor> arena_tensor(const dims& shape, dtype type = dtype::float32);

  /// This node's arena, or nullptr (TLS on, or arena_bytes = 0).
  shared_arena* arena();

  /// Changes options().copy_into_arena_min_bytes for later sends.
  void set_copy_into_arena_min_bytes(std::size_t bytes);

  /// Regions of this node's arena lent to other nodes and not yet released.
  std::size_t arena_loans_outstanding() const;

  /// Which host this node is on (tensor_router_options::host_key), or
  /// empty when the node has no shared arena (TLS on, or arena_bytes = 0):
  /// nodes with equal, non-empty keys can share memory.
  std::string host_key() const;

  /// This node's data-plane address (empty when encrypted): its host key
  /// line, then the UCX worker address.
  std::string data_plane_address() const;

  /// The data plane, or nullptr when TLS is on (tests read its stats).
  data_plane* plane();

  tensor_router_stats stats() const;

  /// Stops the actor, fails what is queued, closes the data plane.
  /// Idempotent; call it from a thread of your own.
  void stop();

  caf::actor actor() const;

private:
  explicit tensor_router(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

/// What an actor wraps a tensor handler's body in: records the message as
/// received (with its flow id, so the trace links it to its send) and the
/// handler's start and end. Costs a branch while tracing is off.
class tensor_receive_scope {
public:
  tensor_receive_scope(trace::name_id actor, const tensor_message& message) noexcept;
  ~tensor_receive_scope();
  tensor_receive_scope(const tensor_receive_scope&) = delete;
  tensor_receive_scope& operator=(const tensor_receive_scope&) = delete;

private:
  trace::name_id actor_;
  trace::name_id kind_;
};

/// The trace name of a message kind ("forward_activation", ...), interned once.
trace::name_id trace_kind(message_kind kind);

} // namespace troupe::actors
