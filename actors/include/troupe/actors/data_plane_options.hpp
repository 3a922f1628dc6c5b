#pragma once
// Configuration of one node's data plane (data_plane.hpp).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "troupe/actors/shared_arena.hpp"
#include "troupe/actors/tensor_message.hpp"

namespace troupe::actors {

/// Identifies a remote node on one data plane (1, 2, ...; 0 is never valid).
using peer_id = std::uint32_t;

/// Called on the transport thread with each delivered message. Keep it short
/// (hand the message to an actor); it may call data_plane::send().
using receive_handler = std::function<void(peer_id from, tensor_message&& message)>;

/// Called on the transport thread with each tensor a same-host peer handed
/// over by reference (data_plane::send_by_reference). The frame's sizes,
/// token and header were checked; the region itself is the mapper's to
/// validate (arena_mapper::open). Whoever takes it owes the peer a release.
using arena_receive_handler = std::function<void(peer_id from, arena_handoff&& handoff)>;

/// Called on the transport thread when a peer says it is done with a region
/// of this node's arena (data_plane::send_release). Untrusted: the handler
/// checks that the region was lent to that peer (arena_loans).
using release_handler = std::function<void(peer_id from, const arena_ref& region)>;

struct data_plane_options {
  /// This node's name, sent to peers when connecting and used in logs.
  std::string node_name;
  /// The job's token: stamped into every frame sent and required in every
  /// frame received (docs/design.md, "Encryption"). Must not be 0: 0 is what a
  /// frame without a token carries.
  std::uint64_t token = 0;
  /// UCX transports for this job (UCX_TLS syntax: "tcp", "sm,self", ...);
  /// empty: UCX's choice (or the UCX_TLS environment variable).
  std::string transports;
  /// UCX_NET_DEVICES for this job ("lo", "veth0", ...); empty: all.
  std::string net_devices;
  /// Largest payload accepted or sent; larger messages are refused on send
  /// and dropped on receive.
  std::uint64_t max_message_bytes = std::uint64_t{1} << 30;
  /// A connection to UCX's TCP listener that has not sent UCX's connection
  /// handshake within this time is closed (UCX itself never gives up on it).
  std::chrono::milliseconds handshake_deadline{5000};
  /// Bytes (header + payload) a sender may have unacknowledged per peer.
  std::size_t credit_window_bytes = std::size_t{64} << 20;
  /// Sends waiting for credits per peer; beyond it send() refuses
  /// (errc::size_limit_exceeded), which is the caller's back-pressure.
  std::size_t max_queued_sends = 256;
  /// Payloads of at least this many bytes go by rendezvous (the receiver
  /// pulls them into its own buffer); smaller ones go eagerly.
  std::size_t rendezvous_threshold = std::size_t{64} << 10;
  /// To a peer on another host (connect(..., on_another_host)), payloads
  /// up to this many bytes go eagerly instead. Over TCP a rendezvous
  /// handshake rides the same connection as the data, so when both
  /// directions are busy (a ring allreduce) each handshake waits behind
  /// the data queued before it; on a 1 Gbit/s link that halved the ring's
  /// busbw (docs/scaling.md, "Eager to other hosts"). 0:
  /// rendezvous_threshold for every peer.
  std::size_t network_eager_bytes = std::size_t{4} << 20;
  /// Freed heap memory the process keeps mapped (glibc's trim threshold),
  /// and blocks up to network_eager_bytes served from the heap rather than
  /// mapped one by one, set when the plane starts. UCX assembles an eager
  /// message in a block of its own; without this every such block is fresh
  /// pages, faulted in and cleared on the transport thread (a one-way
  /// stream of 1 MiB tensors to another host ran 1.5-2.9x slower,
  /// docs/performance.md). Process-wide, and only ever raised. 0: leave
  /// malloc's settings alone.
  std::size_t keep_freed_heap_bytes = std::size_t{256} << 20;
  /// Rendezvous sends per peer handed to UCX and not yet completed (the
  /// receiver has not pulled the payload yet); more wait in the queue even
  /// when the credit window has room. Over tcp on two cores 4 outran 64 at
  /// 1 MiB (docs/performance.md, "Data plane transport"). 0: no limit beyond the window.
  std::size_t max_rendezvous_in_flight = 4;
  /// After the last piece of work, keep progressing the worker this long
  /// (yielding the core to any other runnable thread between polls) before
  /// sleeping in epoll; owed acks go back when the spin ends. A reply that
  /// comes back within it is not delayed by waking a sleeping thread: over
  /// tcp the median round trip went from 49-70 to 27-41 us, p99 from 70-128
  /// to 48-67 us (docs/performance.md, "Data plane transport"); pipeline throughput was
  /// unchanged. 0: sleep at once (no CPU spent when idle, slower replies).
  std::chrono::microseconds spin_before_sleep{50};
  /// The same poll, for as long as a rendezvous transfer (a large payload
  /// being sent or pulled) is under way on this node: its next piece is due
  /// within microseconds, and a sleeping thread wakes late for it. Bounded
  /// since the last progress, so a stalled transfer (a dead peer) does not
  /// keep a core busy. 0: only spin_before_sleep.
  std::chrono::microseconds spin_while_transferring{1000};
  /// Where delivered messages go (required).
  receive_handler on_receive;
  /// Where tensors handed over by reference go; without it such frames are
  /// dropped (and acknowledged) as unsupported.
  arena_receive_handler on_arena;
  /// Where release messages for this node's arena go; without it they are
  /// dropped.
  release_handler on_release;
};

} // namespace troupe::actors
