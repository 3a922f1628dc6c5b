#pragma once
// The trace recorder: what actor code and the data plane call to record
// events (docs/design.md, "Tracing").
//
// Enabling. One recording session per process (a node starts it when
// TROUPE_TRACE_DIR is set, see start_from_environment below).
// From tests/actors/trace_test.cpp:
//
//   trace::options opts;
//   opts.directory = dir.string();
//   opts.node = "node a";
//   ASSERT_TRUE(trace::start(opts));
//   ...
//   trace::stop();
//
// `trace::start_from_environment("node0")` starts a session when
// TROUPE_TRACE_DIR is set (TROUPE_TRACE_MAX_BYTES overrides the memory cap).
//
// Recording. Names are interned once (actor names at spawn, message kinds
// once per type) and records refer to them by a small id; the flow id
// travels with the message, so the receiver's record matches the sender's.
// From tests/actors/trace_test.cpp:
//
//   auto forward = trace::intern("forward");
//   auto flow = trace::next_flow_id();
//   trace::message_sent(alice, {forward, bob, 1000, flow, 7, 2});
//   trace::message_received(bob, {forward, alice, 1000, flow, 7, 2});
//   trace::handler_scope h(bob, {forward, alice, 1000, flow, 7, 2});
//   trace::data_write(bob, alice, 4096, flow, trace::now_ns() - 500);
//
// Cost and thread model. Every recording call is one relaxed load and a
// branch while tracing is off. While on, a call appends one 64-byte record to
// the calling thread's own ring (single producer, no lock, no allocation, no
// syscall beyond the vDSO clock read); a background thread drains all rings
// every `flush_interval` and appends chunks to the file. Rings are bounded:
// together they never exceed `max_bytes`. When a ring is full the new record
// is dropped and counted, and the flusher writes a `dropped` record with the
// count, so a reader knows where and how much was lost. Recording never blocks.
//
// Records not yet flushed when the process is killed are lost (at most one
// flush interval's worth); everything flushed before stays readable.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/actors/trace_format.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::trace {

/// How a recording session writes and how much memory it may use.
struct options {
  /// Directory for the trace file; created if missing.
  std::string directory;
  /// Node name: part of the file name and the process's track name.
  std::string node = "node";
  /// Flow-id prefix: the node's rank + 1 when >= 0, otherwise a hash of the
  /// node name and pid. Either way flow ids are unique across the job.
  std::int64_t rank = -1;
  /// Cap on all per-thread rings together. Threads beyond the cap record
  /// nothing (their records are counted as dropped).
  std::size_t max_bytes = std::size_t{64} << 20;
  /// Size of one thread's ring, rounded down to a power of two records; at
  /// most max_bytes.
  std::size_t thread_buffer_bytes = std::size_t{1} << 20;
  /// How often the background thread drains the rings.
  std::chrono::milliseconds flush_interval{20};
};

/// A string id (see `intern`); 0 = none.
struct name_id {
  std::uint32_t value = 0;
  friend bool operator==(name_id, name_id) = default;
};

/// Fields of a message event. `peer` is the sender of a received message and
/// the receiver of a sent one. (A constructor rather than designated
/// initializers: g++ 12 warns about omitted fields in those.)
struct message_info {
  message_info() = default;
  message_info(name_id kind_, name_id peer_ = {}, std::uint64_t bytes_ = 0,
               std::uint64_t flow_ = 0, std::uint32_t step_ = no_step,
               std::uint32_t micro_batch_ = no_step) noexcept
      : kind(kind_), peer(peer_), bytes(bytes_), flow(flow_), step(step_),
        micro_batch(micro_batch_) {}
  name_id kind;
  name_id peer;
  std::uint64_t bytes = 0;
  std::uint64_t flow = 0;
  std::uint32_t step = no_step;
  std::uint32_t micro_batch = no_step;
};

/// Counters of the current (or last) session.
struct recorder_stats {
  std::uint64_t records = 0;      ///< records written to the file
  std::uint64_t dropped = 0;      ///< records lost to full rings
  std::uint64_t chunks = 0;       ///< chunks written
  std::uint64_t file_bytes = 0;   ///< bytes in the file
  std::size_t buffer_bytes = 0;   ///< ring memory now allocated (<= max_bytes)
  std::size_t threads = 0;        ///< threads with a ring now
  std::string path;               ///< the trace file
};

/// Starts a session: opens `<directory>/trace-<node>-<pid>.bin` and the flush
/// thread. An error when a session is running or the file cannot be created.
expected<void> start(const options& opts);

/// Starts a session if TROUPE_TRACE_DIR is set; success (doing nothing) if not.
expected<void> start_from_environment(std::string_view node, std::int64_t rank = -1);

/// Drains every ring, writes the rest, closes the file. Idempotent; also run
/// at exit.
void stop();

/// Writes everything recorded so far before returning (for tests and for
/// checkpoints of long runs; the hot path never needs it).
void flush();

/// Statistics of the running session, or of the last one after stop().
recorder_stats stats();

/// The interned id of `text` (at most 4096 bytes are kept). Takes a lock:
/// call it once per name and keep the id. Ids are valid for the life of the
/// process, across sessions.
name_id intern(std::string_view text);

/// steady_clock now, in ns: the clock of every record.
inline std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace detail {
// The one flag the disabled path reads.
inline std::atomic<bool> enabled_flag{false};
void push(record r) noexcept;
std::uint64_t next_flow_id_slow() noexcept;
} // namespace detail

/// True while a session is recording.
inline bool enabled() noexcept { return detail::enabled_flag.load(std::memory_order_relaxed); }

/// A flow id unique across the job (high bits from the node's rank or name),
/// 0 while tracing is off. Send it with the message and pass it to
/// message_received on the other side.
inline std::uint64_t next_flow_id() noexcept {
  return enabled() ? detail::next_flow_id_slow() : 0;
}

namespace detail {
inline record make_message_record(event_type type, name_id actor, const message_info& m) noexcept {
  record r;
  r.type = type;
  r.actor = actor.value;
  r.peer = m.peer.value;
  r.kind = m.kind.value;
  r.value = m.bytes;
  r.flow_id = m.flow;
  r.step = m.step;
  r.micro_batch = m.micro_batch;
  return r;
}
inline record make_transfer_record(event_type type, name_id actor, name_id peer,
                                   std::uint64_t bytes, std::uint64_t flow,
                                   std::int64_t start_ns) noexcept {
  record r;
  r.type = type;
  r.actor = actor.value;
  r.peer = peer.value;
  r.value = bytes;
  r.flow_id = flow;
  r.duration_ns = start_ns; // push() turns it into now - start
  return r;
}
} // namespace detail

/// `receiver` took message `m` (from `m.peer`) out of its mailbox.
inline void message_received(name_id receiver, const message_info& m) noexcept {
  if (enabled()) [[unlikely]]
    detail::push(detail::make_message_record(event_type::message_received, receiver, m));
}

/// `sender` sent message `m` to `m.peer`.
inline void message_sent(name_id sender, const message_info& m) noexcept {
  if (enabled()) [[unlikely]]
    detail::push(detail::make_message_record(event_type::message_sent, sender, m));
}

/// `actor` starts handling message `m` (kind, flow, step, micro-batch used).
inline void handler_start(name_id actor, const message_info& m) noexcept {
  if (enabled()) [[unlikely]]
    detail::push(detail::make_message_record(event_type::handler_start, actor, m));
}

/// `actor`'s handler for `kind` returned.
inline void handler_end(name_id actor, name_id kind) noexcept {
  if (enabled()) [[unlikely]]
    detail::push(detail::make_message_record(event_type::handler_end, actor, message_info(kind)));
}

/// A data-plane write of `bytes` to `peer` that began at `start_ns` (now_ns())
/// has completed. `actor` may be {} when no actor drives the transfer.
inline void data_write(name_id actor, name_id peer, std::uint64_t bytes, std::uint64_t flow,
                       std::int64_t start_ns) noexcept {
  if (enabled()) [[unlikely]]
    detail::push(
        detail::make_transfer_record(event_type::data_write, actor, peer, bytes, flow, start_ns));
}

/// A data-plane read of `bytes` from `peer` that began at `start_ns` has completed.
inline void data_read(name_id actor, name_id peer, std::uint64_t bytes, std::uint64_t flow,
                      std::int64_t start_ns) noexcept {
  if (enabled()) [[unlikely]]
    detail::push(
        detail::make_transfer_record(event_type::data_read, actor, peer, bytes, flow, start_ns));
}

/// A free-form span `name` opens (closes) on `actor` ({} = the thread's track).
inline void span_begin(name_id actor, name_id name) noexcept {
  if (enabled()) [[unlikely]]
    detail::push(detail::make_message_record(event_type::span_begin, actor, message_info(name)));
}
inline void span_end(name_id actor, name_id name) noexcept {
  if (enabled()) [[unlikely]]
    detail::push(detail::make_message_record(event_type::span_end, actor, message_info(name)));
}

/// Counter `name` now has `value`.
inline void counter(name_id name, std::int64_t value) noexcept {
  if (enabled()) [[unlikely]] {
    record r;
    r.type = event_type::counter;
    r.kind = name.value;
    r.value = static_cast<std::uint64_t>(value);
    detail::push(r);
  }
}

/// The coordinator's system clock minus this process's system clock, as the
/// node runtime measured it at start-up (coordinator = local + offset_ns),
/// with its uncertainty (e.g. half the round trip). The merge tool shifts
/// this process's events by it; the record with the least uncertainty wins.
void set_clock_offset(std::int64_t offset_ns, std::int64_t uncertainty_ns) noexcept;

/// Records handler_start on construction and handler_end on destruction.
class handler_scope {
public:
  handler_scope(name_id actor, const message_info& m) noexcept : actor_(actor), kind_(m.kind) {
    handler_start(actor, m);
  }
  ~handler_scope() { handler_end(actor_, kind_); }
  handler_scope(const handler_scope&) = delete;
  handler_scope& operator=(const handler_scope&) = delete;

private:
  name_id actor_;
  name_id kind_;
};

/// Records a span around a scope.
class span_scope {
public:
  span_scope(name_id actor, name_id name) noexcept : actor_(actor), name_(name) {
    span_begin(actor, name);
  }
  ~span_scope() { span_end(actor_, name_); }
  span_scope(const span_scope&) = delete;
  span_scope& operator=(const span_scope&) = delete;

private:
  name_id actor_;
  name_id name_;
};

} // namespace troupe::trace
