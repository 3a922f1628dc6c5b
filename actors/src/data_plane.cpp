#include "troupe/actors/data_plane.hpp"

#include <sys/epoll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include "credit_window.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/serialization/decode.hpp"
#include "troupe/serialization/encoded_message.hpp"
#include "troupe/tensor/host_allocator.hpp"
#include "ucx_handshake_deadline.hpp"

// Flow control, step by step (one edge: sender S -> receiver R):
//  1. S's send() encodes the message (header frame + a span of the tensor's
//     memory) and appends it to S's bounded queue for R; a full queue is
//     refused at once (back-pressure to the caller, never an unbounded queue).
//  2. S's transport thread takes messages from the queue while R's credit
//     window has room: each takes header + payload bytes of credit, and is
//     handed to UCX (ucp_am_send_nbx); its header and tensor live in the
//     send_op until UCX completes it.
//  3. R's AM handler validates the header and token before anything else,
//     then pulls the payload (rendezvous) into a pooled 64-byte aligned
//     buffer, or keeps / copies the eager data.
//  4. R delivers the tensor (aliasing that buffer) to its receive handler,
//     then sends an ack AM to S carrying the bytes (header + payload, both
//     known to R from the AM itself) — also for a message it dropped, so a
//     rejected frame does not leak S's credits. A rejected *rendezvous*
//     frame is refused through UCX instead (the handler returns an error and
//     S's send completes with it); then S gives the credits back itself.
//  5. S's ack handler returns the credits and posts more from the queue.
// So at most `credit_window_bytes` are unacknowledged per edge, plus
// `max_queued_sends` messages waiting, plus what the receive handler holds.
// Two refinements, both only tighter bounds:
//  - At most `max_rendezvous_in_flight` (4) rendezvous sends per peer are
//    in UCX at once (posted, send not yet complete), whatever the window.
//  - R coalesces acks per peer: it sends one ack (bytes, messages) when 16
//    messages or 256 KiB are owed, when its thread goes idle (always before
//    it can sleep), or when the oldest owed ack has waited 200 us, so a
//    credit is never held back longer than that. Replies that the delivered
//    messages caused go out before the acks.
//
// Measured (2026-11, this 2-core VM, UCX 1.13, loopback, a two-process
// driver like bench/transport's plane_session: 400 x 1 MiB / 10000 x 4 KiB
// after a warm-up, old and new builds alternated within the same minute;
// the machine was loaded (load average 3-5 from other builds), so single
// figures swing by 2x and only the alternated comparisons mean anything):
//  - Where the time goes (perf record -g, 1 MiB over tcp): UCX 1.13's tcp
//    rendezvous is put_zcopy, the receiver recv()s straight into our lent
//    buffer; its thread is ~50% _copy_to_iter (the kernel copy), the
//    sender's ~25% _copy_from_iter. Neither thread was saturated: the gap
//    to ucx_perftest is waiting (wake-ups), not work. The receiver's
//    page faults (memmove into fresh pages) scale with the window, not the
//    message count: 64 MiB of first-touched buffers when 64 rendezvous are
//    in flight, then host_allocator's cache hits.
//  - Rendezvous in flight: with the 64 MiB window, 64 x 1 MiB rendezvous
//    were in flight. Over tcp, three alternated rounds: a window of 4
//    messages 4.1-5.4 GB/s against 1.8-4.9 with 64; a cap of 4 (window
//    64 MiB) 3.9-5.2 against 3.2-4.4 without it. Over sm,self 4.3-11.7
//    (mostly 10-11) against 5.1-8.3 GB/s. 16 and 64 MiB messages are bounded by the window
//    (3 and 1 in flight) before the cap, so they are unchanged.
//  - Acks: one ack per message cost 4 KiB over tcp about a third of its
//    rate (0.30-0.86 GB/s coalesced against 0.28-0.55 with the same code
//    acking every message, 0.15-0.42 before both changes; alternated).
//    At 1 MiB each ack goes at once (256 KiB bound), as before. The byte
//    bound matters: coalescing only until the end of the progress burst
//    halved 16 MiB over tcp (4.1 -> 2.4 GB/s), because while a stream of
//    put data keeps ucp_worker_progress busy the burst does not end.
//  - bench/transport --quick --no-peers, the parent commit's build and
//    this one alternated, ucx_perftest ucp_am_bw -w 4 -O 4 -n 400 right
//    after each pair (4 rounds, load easing from 5 to 2): tcp 1 MiB
//    1.2-2.1 -> 3.6-8.2 GB/s (last two rounds 8.21 vs perftest 7.80 and
//    7.57 vs 8.98); sm,self 1 MiB 2.1-2.8 -> 7.2-14.2 GB/s (14.15 vs
//    15.74, 11.95 vs 11.97); 4 KiB tcp 0.21-0.36 -> 0.44-0.83 GB/s; 16 MiB
//    tcp 2.3-3.8 -> 3.0-5.6 GB/s; RTT unchanged (30-47 us, epoll sleep).
//  - Did not help: spinning before sleeping (spin_before_sleep 20 and 100
//    us: 3.5-4.2 and 3.2-4.1 GB/s against 3.8-4.8 with 0 at 1 MiB tcp; two
//    spinning threads on two cores take the CPU the copies need; default
//    stays 0, so idle CPU stays 0), eager at 1 MiB (rendezvous_threshold
//    4 MB: 3.0-3.5 against 3.4-4.2 GB/s). The 64 KiB rendezvous threshold and UCX's defaults
//    (RNDV_THRESH=auto, tcp put_zcopy, TX/RX seg 8K/64K) were kept.
//  - Revisited 2026-11-24 (bench/transport, 5-7 sessions of 2000 round
//    trips per setting, settings alternated in two passes; the bench's own
//    sender no longer polls every 20 us while it waits, which had taken a
//    core's share from the transport threads in the figures above):
//    * Over tcp an ack is a send() of its own, and it went out before the
//      reply that the delivered message caused. Replies now go first
//      (drain() before flush_acks()), and acks wait until the thread goes
//      idle: spin 0, median round trip 52-70 -> 49 us.
//    * A spin that yields the core between polls (sched_yield: a runnable
//      compute thread gets it at once) for 50 us: 49 -> 27-33 us, p99
//      70-128 -> 48-67 us; 1-64 MiB throughput within noise; the pipeline
//      bench over two processes unchanged (+-5%, two A/B passes). Now the
//      default (data_plane_options::spin_before_sleep).
//    * Not kept: letting the sending thread post an eager send itself while
//      the transport thread sleeps (a worker mutex, UCS_THREAD_MODE_
//      SERIALIZED): round trip 51 vs 52 us, 4 KiB throughput halved.
//  - 2026-11-24 (fifth session), the tcp gap to ucx_perftest at 16-64 MiB:
//    * Per byte both cost the same: perf record, 16 MiB x 220, gave the
//      same samples in the sender (_copy_from_iter) and receiver
//      (_copy_to_iter) as perftest -E sleep. perftest's lead came from its
//      buffers: it never writes them (the kernel copies its zero page,
//      cache-hot; bench/perftest_written_buffers.c writes them), and they
//      lie on huge pages (host_allocator.cpp now maps large blocks so:
//      tcp 16 MiB about 8% faster). The rest is waking: a sleeping thread
//      resumes late when the socket drains.
//    * So the thread polls (yielding the core between polls) while a
//      rendezvous transfer is under way, up to spin_while_transferring
//      (1 ms) since its last progress: bench/transport --no-peers, old and
//      new builds alternated three times, tcp 16 MiB 4.14-4.29 / 3.28-3.56
//      / 4.24-4.29 -> 4.12-4.36 / 4.39-4.65 / 4.30-4.52 GB/s; the pipeline
//      bench over two processes 0-5% faster in two passes (the third was
//      disturbed for both builds).

namespace troupe::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct hello_header {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t sender_peer; // the sender's id for this link; echoed in acks
  std::uint32_t name_bytes;
  std::uint32_t reserved;
};

struct ack_header {
  std::uint64_t peer; // the data sender's id for this link
  std::uint64_t bytes;
  std::uint64_t messages;
};

struct goodbye_header {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t sender_peer;
};

/// Followed by the arena's name and the Cap'n Proto header frame.
struct arena_header {
  std::uint64_t magic;
  std::uint64_t offset;
  std::uint64_t length;
  std::uint32_t name_bytes;
  std::uint32_t header_bytes;
};

/// Followed by the arena's name.
struct release_header {
  std::uint64_t magic;
  std::uint64_t token;
  std::uint64_t offset;
  std::uint64_t length;
  std::uint32_t name_bytes;
  std::uint32_t reserved;
};

std::string status_text(ucs_status_t status) { return ucs_status_string(status); }

} // namespace

class data_plane::impl : public std::enable_shared_from_this<data_plane::impl> {
public:
  struct send_op;

  /// One remote node. Fields under "queue" are guarded by mutex_; the rest
  /// belong to the transport thread (credits, endpoints).
  struct peer {
    peer_id id = 0;
    std::string name;
    trace::name_id trace_name; // the peer's node name, interned once
    // queue (mutex_)
    std::deque<std::unique_ptr<send_op>> queued;
    bool closed = false;
    // transport thread
    ucp_ep_h own_ep = nullptr;   // created by connect(); we close it
    ucp_ep_h reply_ep = nullptr; // the peer's endpoint towards us (from its hello)
    std::uint64_t remote_id = 0; // the peer's id for us, echoed in acks
    credit_window credits;
    std::size_t rendezvous_in_flight = 0; // posted, not completed (mutex_)
    // acks owed to this peer, sent by flush_acks() (transport thread)
    std::size_t ack_bytes = 0;
    std::size_t ack_messages = 0;
    bool ack_listed = false; // in acks_owed_
    std::atomic<std::size_t> in_flight{0};
    std::atomic<std::size_t> high_water{0};
    explicit peer(std::size_t window) : credits(window) {}
    ucp_ep_h ep() const { return own_ep ? own_ep : reply_ep; }
  };

  struct send_op {
    impl* owner = nullptr;
    peer_id to = 0;
    encoded_message encoded;
    std::size_t credit_bytes = 0;
    bool rendezvous = false; // counted in peer::rendezvous_in_flight
    completion_callback done;
    std::int64_t start_ns = 0; // trace: when send() took it
    std::uint64_t flow = 0;
    // An arena frame (send_by_reference) instead of header + payload.
    unsigned am_id = data_plane_wire::data_am;
    std::vector<std::byte> frame;
    std::size_t trace_bytes = 0; // the tensor's bytes, for the trace
  };

  /// A small control AM (hello, ack, goodbye) whose header must outlive the
  /// send: UCX reads the header until completion.
  struct control_op {
    std::vector<std::byte> header;
  };

  /// A rendezvous receive in progress.
  struct receive_op {
    impl* owner = nullptr;
    peer_id from = 0;
    std::vector<std::uint64_t> header; // copy: UCX's header dies with the handler
    std::size_t header_bytes = 0;
    std::shared_ptr<storage> buffer;
    std::size_t credit_bytes = 0;
    std::int64_t start_ns = 0; // trace: when the frame arrived
  };

  explicit impl(data_plane_options options) : options_(std::move(options)) {
    decode_options_.max_payload_bytes = options_.max_message_bytes;
    trace_self_ = trace::intern(options_.node_name + "/ucx");
  }

  ~impl() {
    // Only when the last tensor holding UCX's persistent eager data is gone
    // (their deleters keep this object alive), so nothing points into the
    // worker any more.
    if (worker_)
      ucp_worker_destroy(worker_);
    if (context_)
      ucp_cleanup(context_);
    if (epoll_fd_ >= 0)
      ::close(epoll_fd_);
    if (wake_fd_ >= 0)
      ::close(wake_fd_);
  }

  expected<void> init() {
    if (options_.token == 0)
      return make_error(errc::invalid_argument,
                        "data plane: the job token must not be 0 (0 marks a frame without one)");
    if (!options_.on_receive)
      return make_error(errc::invalid_argument, "data plane: on_receive is required");
    if (options_.credit_window_bytes == 0 || options_.max_queued_sends == 0)
      return make_error(errc::invalid_argument,
                        "data plane: credit window and send queue must be positive");
    // UCX opens its TCP listener in ucp_worker_create; the listeners that
    // appear meanwhile are its (this thread is the only one starting sockets
    // here), and the handshake deadline watches their ports.
    auto listeners_before = detail::listening_tcp_sockets();
    ucp_config_t* config = nullptr;
    if (auto s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK)
      return make_error(errc::io_error, "data plane: ucp_config_read: {}", status_text(s));
    auto modify = [&](const char* key, const std::string& value) -> expected<void> {
      if (value.empty())
        return {};
      if (auto s = ucp_config_modify(config, key, value.c_str()); s != UCS_OK)
        return make_error(errc::invalid_argument, "data plane: UCX {}={} refused: {}", key,
                          value, status_text(s));
      return {};
    };
    if (auto ok = modify("TLS", options_.transports); !ok) {
      ucp_config_release(config);
      return ok.error();
    }
    if (auto ok = modify("NET_DEVICES", options_.net_devices); !ok) {
      ucp_config_release(config);
      return ok.error();
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 0;
    auto s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK)
      return make_error(errc::io_error, "data plane: ucp_init (TLS '{}'): {}",
                        options_.transports, status_text(s));
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE |
                               UCP_WORKER_PARAM_FIELD_AM_ALIGNMENT;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    // Eager data UCX lets us keep is then aligned like our own buffers.
    worker_params.am_alignment = storage::alignment;
    if (s = ucp_worker_create(context_, &worker_params, &worker_); s != UCS_OK)
      return make_error(errc::io_error, "data plane: ucp_worker_create: {}", status_text(s));
    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    if (s = ucp_worker_get_address(worker_, &address, &length); s != UCS_OK)
      return make_error(errc::io_error, "data plane: ucp_worker_get_address: {}",
                        status_text(s));
    std::set<std::uint16_t> ucx_ports;
    for (auto& [inode, port] : detail::listening_tcp_sockets())
      if (!listeners_before.contains(inode))
        ucx_ports.insert(port);
    detail::handshake_deadline_options deadline;
    deadline.deadline = options_.handshake_deadline;
    handshake_deadline_.emplace(std::move(ucx_ports), deadline);
    address_.assign(reinterpret_cast<const std::byte*>(address),
                    reinterpret_cast<const std::byte*>(address) + length);
    ucp_worker_release_address(worker_, address);

    auto handler = [&](unsigned id, ucp_am_recv_callback_t cb, std::uint32_t flags) {
      ucp_am_handler_param_t p{};
      p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                     UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      p.id = id;
      p.flags = flags;
      p.cb = cb;
      p.arg = this;
      return ucp_worker_set_am_recv_handler(worker_, &p);
    };
    if ((s = handler(data_plane_wire::hello_am, &impl::on_hello_am, 0)) != UCS_OK ||
        (s = handler(data_plane_wire::data_am, &impl::on_data_am, UCP_AM_FLAG_PERSISTENT_DATA)) !=
            UCS_OK ||
        (s = handler(data_plane_wire::ack_am, &impl::on_ack_am, 0)) != UCS_OK ||
        (s = handler(data_plane_wire::goodbye_am, &impl::on_goodbye_am, 0)) != UCS_OK ||
        (s = handler(data_plane_wire::arena_am, &impl::on_arena_am, 0)) != UCS_OK ||
        (s = handler(data_plane_wire::release_am, &impl::on_release_am, 0)) != UCS_OK)
      return make_error(errc::io_error, "data plane: ucp_worker_set_am_recv_handler: {}",
                        status_text(s));

    int worker_fd = -1;
    if (s = ucp_worker_get_efd(worker_, &worker_fd); s != UCS_OK)
      return make_error(errc::io_error, "data plane: ucp_worker_get_efd: {}", status_text(s));
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (wake_fd_ < 0 || epoll_fd_ < 0)
      return make_error(errc::io_error, "data plane: eventfd/epoll: {}", std::strerror(errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = worker_fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, worker_fd, &ev) != 0)
      return make_error(errc::io_error, "data plane: epoll_ctl: {}", std::strerror(errno));
    ev.data.fd = wake_fd_;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0)
      return make_error(errc::io_error, "data plane: epoll_ctl: {}", std::strerror(errno));
    running_ = true;
    thread_ = std::thread([this] { run(); });
    return {};
  }

  // -- calls from any thread ------------------------------------------------

  expected<peer_id> connect(std::string name, std::span<const std::byte> address) {
    if (name.empty() || name.size() > data_plane_wire::max_name_bytes)
      return make_error(errc::invalid_argument, "data plane: peer name '{}' is empty or too long",
                        name);
    if (address.empty())
      return make_error(errc::invalid_argument, "data plane: empty address for peer '{}'", name);
    auto result = std::make_shared<std::promise<expected<peer_id>>>();
    auto future = result->get_future();
    std::vector<std::byte> copy(address.begin(), address.end());
    if (auto ok = post([this, name, copy = std::move(copy), result]() mutable {
          result->set_value(do_connect(std::move(name), copy));
        });
        !ok)
      return ok.error();
    if (future.wait_for(std::chrono::seconds(5)) != std::future_status::ready)
      return make_error(errc::io_error, "data plane: connecting to '{}' timed out", name);
    return future.get();
  }

  expected<void> send(peer_id to, tensor_message message, completion_callback done) {
    if (!message.value.defined() || message.value.where().kind != device_kind::cpu)
      return make_error(errc::invalid_argument,
                        "data plane: send to peer {} needs a defined CPU tensor", to);
    auto op = std::make_unique<send_op>();
    op->owner = this;
    op->to = to;
    op->start_ns = trace::now_ns();
    op->flow = message.flow_id;
    auto meta = std::move(message.meta);
    meta.token = options_.token;
    meta.flow_id = message.flow_id;
    op->encoded = encode(meta, message.value);
    if (op->encoded.payload().size() > options_.max_message_bytes)
      return make_error(errc::size_limit_exceeded,
                        "data plane: message of {} bytes to peer {} is above the limit {}",
                        op->encoded.payload().size(), to, options_.max_message_bytes);
    op->credit_bytes = op->encoded.size();
    op->rendezvous = op->encoded.payload().size() >= options_.rendezvous_threshold;
    op->trace_bytes = op->encoded.payload().size();
    op->done = std::move(done);
    return enqueue(std::move(op));
  }

  expected<void> send_by_reference(peer_id to, tensor_message message, const arena_ref& region,
                                   completion_callback done) {
    if (!message.value.defined() || message.value.where().kind != device_kind::cpu)
      return make_error(errc::invalid_argument,
                        "data plane: send to peer {} needs a defined CPU tensor", to);
    if (region.arena.empty() || region.arena.size() > data_plane_wire::max_arena_name_bytes ||
        region.length != message.value.nbytes())
      return make_error(errc::invalid_argument,
                        "data plane: arena region '{}' ({} bytes) does not describe a {} byte tensor",
                        region.arena, region.length, message.value.nbytes());
    auto op = std::make_unique<send_op>();
    op->owner = this;
    op->to = to;
    op->start_ns = trace::now_ns();
    op->flow = message.flow_id;
    op->am_id = data_plane_wire::arena_am;
    op->trace_bytes = message.value.nbytes();
    auto meta = std::move(message.meta);
    meta.token = options_.token;
    meta.flow_id = message.flow_id;
    auto encoded = encode(meta, message.value);
    auto header = encoded.header_bytes();
    if (header.size() > data_plane_wire::max_arena_header_bytes)
      return make_error(errc::size_limit_exceeded, "data plane: arena frame header of {} bytes",
                        header.size());
    arena_header h{data_plane_wire::magic, region.offset, region.length,
                   static_cast<std::uint32_t>(region.arena.size()),
                   static_cast<std::uint32_t>(header.size())};
    op->frame.resize(sizeof h + region.arena.size() + header.size());
    std::memcpy(op->frame.data(), &h, sizeof h);
    std::memcpy(op->frame.data() + sizeof h, region.arena.data(), region.arena.size());
    std::memcpy(op->frame.data() + sizeof h + region.arena.size(), header.data(), header.size());
    op->credit_bytes = op->frame.size();
    op->done = std::move(done);
    return enqueue(std::move(op));
  }

  void send_release(peer_id to, const arena_ref& region) {
    if (region.arena.empty() || region.arena.size() > data_plane_wire::max_arena_name_bytes)
      return;
    release_header h{data_plane_wire::magic, options_.token, region.offset, region.length,
                     static_cast<std::uint32_t>(region.arena.size()), 0};
    std::vector<std::byte> header(sizeof h + region.arena.size());
    std::memcpy(header.data(), &h, sizeof h);
    std::memcpy(header.data() + sizeof h, region.arena.data(), region.arena.size());
    {
      std::lock_guard guard(mutex_);
      if (closing_)
        return;
      // Not bounded like sends: each release answers a handoff this node
      // accepted, so there are never more than the handoffs received.
      releases_out_.emplace_back(to, std::move(header));
    }
    wake();
  }

  expected<void> enqueue(std::unique_ptr<send_op> op) {
    auto to = op->to;
    {
      std::lock_guard guard(mutex_);
      if (closing_)
        return make_error(errc::io_error, "data plane: closed");
      auto* p = find(to);
      if (!p)
        return make_error(errc::invalid_argument, "data plane: no peer {}", to);
      if (p->closed)
        return make_error(errc::io_error, "data plane: peer '{}' is closed", p->name);
      if (p->queued.size() >= options_.max_queued_sends) {
        ++stats_.back_pressure_refusals;
        return make_error(errc::size_limit_exceeded,
                          "data plane: {} sends already queued to peer '{}' (back-pressure)",
                          p->queued.size(), p->name);
      }
      p->queued.push_back(std::move(op));
      sends_waiting_ = true;
    }
    wake();
    return {};
  }

  void disconnect(peer_id who) {
    (void)post([this, who] {
      if (auto* p = find_locked(who))
        drop_peer(*p, "disconnected by the control plane", true);
    });
  }

  expected<peer_id> find_peer(const std::string& name) const {
    std::lock_guard guard(mutex_);
    for (auto& p : peers_)
      if (p->name == name)
        return p->id;
    return make_error(errc::invalid_argument, "data plane: no peer named '{}'", name);
  }

  std::string peer_name(peer_id who) const {
    std::lock_guard guard(mutex_);
    auto* p = const_cast<impl*>(this)->find(who);
    return p ? p->name : fmt::format("#{}", who);
  }

  data_plane_stats stats() const {
    std::lock_guard guard(mutex_);
    auto out = stats_;
    for (auto& p : peers_)
      out.max_in_flight_bytes = std::max<std::uint64_t>(out.max_in_flight_bytes, p->high_water);
    out.rendezvous_in_progress = rendezvous_sends_pending_.load(std::memory_order_relaxed) +
                                 rendezvous_receives_pending_.load(std::memory_order_relaxed);
    return out;
  }

  std::size_t in_flight(peer_id who, bool high) const {
    std::lock_guard guard(mutex_);
    auto* p = const_cast<impl*>(this)->find(who);
    if (!p)
      return 0;
    return high ? p->high_water.load() : p->in_flight.load();
  }

  bool is_receive_buffer(const void* ptr) const {
    auto address = reinterpret_cast<std::uintptr_t>(ptr);
    std::lock_guard guard(buffers_mutex_);
    auto it = lent_buffers_.upper_bound(address);
    if (it == lent_buffers_.begin())
      return false;
    --it;
    return address < it->first + std::max<std::size_t>(it->second, 1);
  }

  const std::vector<std::byte>& address() const { return address_; }

  void close() {
    {
      std::lock_guard guard(mutex_);
      if (closing_ || !running_)
        return;
      closing_ = true;
    }
    wake();
    if (thread_.joinable())
      thread_.join();
  }

private:
  // -- helpers for other threads ---------------------------------------------

  expected<void> post(std::function<void()> command) {
    {
      std::lock_guard guard(mutex_);
      if (closing_)
        return make_error(errc::io_error, "data plane: closed");
      // Commands are rare (connect, disconnect); sends have their own bounded
      // queues. The bound only guards against a runaway caller.
      if (commands_.size() >= 1024)
        return make_error(errc::size_limit_exceeded, "data plane: command queue full");
      commands_.push_back(std::move(command));
    }
    wake();
    return {};
  }

  void wake() {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }

  peer* find(peer_id who) {
    if (who == 0 || who > peers_.size())
      return nullptr;
    return peers_[who - 1].get();
  }
  peer* find_locked(peer_id who) {
    std::lock_guard guard(mutex_);
    return find(who);
  }

  // -- transport thread --------------------------------------------------------

  void run() {
    epoll_event events[2];
    auto next_sweep = clock_type::now() + sweep_interval;
    for (;;) {
      if (auto now = clock_type::now(); now >= next_sweep) {
        sweep_silent_connections(now);
        next_sweep = now + sweep_interval;
      }
      while (ucp_worker_progress(worker_) != 0) {
      }
      // Sends first: an echo or reply leaves before the ack for the message
      // that caused it (over tcp an ack is a send() of its own).
      if (!drain()) {
        flush_acks();
        shutdown();
        return;
      }
      // Acks normally wait until the thread goes idle (below). A sender with
      // a small window may be waiting for them while other peers' traffic
      // keeps this thread busy: none waits longer than max_ack_delay.
      if (!acks_owed_.empty() && clock_type::now() - acks_owed_since_ >= max_ack_delay)
        flush_acks();
      auto spin = transfers_under_way()
                      ? std::max(options_.spin_before_sleep, options_.spin_while_transferring)
                      : options_.spin_before_sleep;
      if (spin.count() > 0) {
        auto until = clock_type::now() + spin;
        bool progressed = false;
        while (clock_type::now() < until && !progressed) {
          progressed = ucp_worker_progress(worker_) != 0 || work_waiting();
          if (!progressed)
            sched_yield();
        }
        if (progressed)
          continue;
      }
      // Going idle: every credit owed goes back now. Acks wait this long
      // (through the spin) so that a ping-pong, whose every burst is one
      // message, does not pay an extra send() per message.
      flush_acks();
      // Arm, then sleep: UCS_ERR_BUSY means events arrived meanwhile. The
      // eventfd stays readable until drain() reads it, so a command posted
      // after drain() still wakes us.
      auto status = ucp_worker_arm(worker_);
      if (status == UCS_ERR_BUSY)
        continue;
      if (status != UCS_OK)
        log("ucp_worker_arm failed: {}", status_text(status));
      // Bounded sleep: UCX handles the end of a stranger's connection to its
      // TCP listener only inside progress, and the worker's event fd does not
      // always wake us for it; without this, closed connections kept their
      // file descriptors until the next transfer (docs/design.md).
      int n = ::epoll_wait(epoll_fd_, events, 2, idle_progress_ms);
      if (n < 0 && errno != EINTR)
        log("epoll_wait failed: {}", std::strerror(errno));
    }
  }

  /// Closes connections to UCX's listener that never sent its handshake,
  /// with one log line per sweep (so at most one a second).
  void sweep_silent_connections(clock_type::time_point now) {
    if (!handshake_deadline_)
      return;
    auto swept = handshake_deadline_->sweep(now);
    if (swept.empty())
      return;
    {
      std::lock_guard guard(mutex_);
      stats_.silent_connections_closed += swept.size();
    }
    log("closed {} connection(s) to UCX's listener: {} {}{}", swept.size(), swept.front().peer,
        swept.front().reason,
        swept.size() > 1 ? fmt::format(" (and {} more)", swept.size() - 1) : std::string());
  }

  bool transfers_under_way() const {
    return rendezvous_sends_pending_ > 0 || rendezvous_receives_pending_ > 0;
  }

  bool work_waiting() {
    std::lock_guard guard(mutex_);
    return sends_waiting_ || !commands_.empty() || closing_;
  }

  /// Runs queued commands and posts queued sends that have credits; false
  /// once close() was called.
  bool drain() {
    std::uint64_t counter = 0;
    [[maybe_unused]] auto n = ::read(wake_fd_, &counter, sizeof counter);
    std::vector<std::function<void()>> commands;
    std::vector<void*> releases;
    bool closing = false;
    {
      std::lock_guard guard(mutex_);
      commands.swap(commands_);
      closing = closing_;
    }
    {
      std::lock_guard guard(release_mutex_);
      releases.swap(releases_);
    }
    for (auto* data : releases)
      ucp_am_data_release(worker_, data);
    for (auto& command : commands)
      command();
    send_releases();
    pump_all();
    return !closing;
  }

  /// Sends the release messages other threads queued (send_release).
  void send_releases() {
    std::vector<std::pair<peer_id, std::vector<std::byte>>> out;
    {
      std::lock_guard guard(mutex_);
      out.swap(releases_out_);
    }
    for (auto& [to, header] : out) {
      auto* p = find_locked(to);
      if (!p || p->closed || !p->ep())
        continue; // the owner is gone; its arena went with it
      send_control(p->ep(), data_plane_wire::release_am, std::move(header));
      std::lock_guard guard(mutex_);
      ++stats_.releases_sent;
    }
  }

  /// Moves queued sends into UCX while each peer's window has room.
  void pump_all() {
    std::vector<std::unique_ptr<send_op>> ready;
    {
      std::lock_guard guard(mutex_);
      sends_waiting_ = false;
      for (auto& p : peers_) {
        while (!p->queued.empty() && p->ep() &&
               p->credits.can_send(p->queued.front()->credit_bytes)) {
          if (p->queued.front()->rendezvous) {
            if (options_.max_rendezvous_in_flight != 0 &&
                p->rendezvous_in_flight >= options_.max_rendezvous_in_flight)
              break; // complete_send() frees a slot; drain() pumps again
            ++p->rendezvous_in_flight;
          }
          p->credits.acquire(p->queued.front()->credit_bytes);
          p->in_flight = p->credits.in_flight();
          p->high_water = p->credits.high_water();
          ready.push_back(std::move(p->queued.front()));
          p->queued.pop_front();
        }
      }
    }
    for (auto& op : ready)
      post_send(std::move(op));
  }

  void post_send(std::unique_ptr<send_op> op) {
    auto* p = find_locked(op->to);
    auto header = op->am_id == data_plane_wire::arena_am ? std::span<const std::byte>(op->frame)
                                                         : op->encoded.header_bytes();
    auto payload = op->encoded.payload();
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_contig(1);
    // REPLY: the receiver learns which endpoint (so which peer) sent it.
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    if (op->rendezvous)
      param.flags |= UCP_AM_SEND_FLAG_RNDV;
    param.cb.send = &impl::on_send_done;
    param.user_data = op.get();
    if (op->am_id == data_plane_wire::arena_am)
      param.flags |= UCP_AM_SEND_FLAG_EAGER;
    auto* request = ucp_am_send_nbx(p->ep(), op->am_id, header.data(),
                                    header.size(), payload.empty() ? nullptr : payload.data(),
                                    payload.size(), &param);
    if (request == nullptr) {
      bool freed_slot = op->rendezvous;
      complete_send(std::move(op), UCS_OK);
      if (freed_slot)
        wake(); // a rendezvous slot came free inside pump_all(): pump again
    } else if (UCS_PTR_IS_ERR(request)) {
      complete_send(std::move(op), UCS_PTR_STATUS(request));
    } else {
      if (op->rendezvous)
        ++rendezvous_sends_pending_;
      op.release(); // owned by UCX until on_send_done, which frees the request
    }
  }

  // A request is freed in its callback: ucp_request_free() before completion
  // would suppress the callback.
  static void on_send_done(void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    std::unique_ptr<send_op> op(static_cast<send_op*>(user_data));
    auto* self = op->owner;
    if (op->rendezvous)
      --self->rendezvous_sends_pending_;
    self->complete_send(std::move(op), status);
  }

  void complete_send(std::unique_ptr<send_op> op, ucs_status_t status) {
    expected<void> result;
    auto* p = find_locked(op->to);
    {
      std::lock_guard guard(mutex_);
      if (p && op->rendezvous && p->rendezvous_in_flight > 0)
        --p->rendezvous_in_flight;
      if (status == UCS_OK) {
        ++stats_.messages_sent;
        stats_.bytes_sent += op->encoded.payload().size();
        if (op->am_id == data_plane_wire::arena_am)
          ++stats_.arena_handoffs_sent;
        trace::data_write(trace_self_, p ? p->trace_name : trace::name_id{}, op->trace_bytes,
                          op->flow, op->start_ns);
      } else {
        ++stats_.send_failures;
      }
    }
    if (status != UCS_OK) {
      // The receiver never delivered it (or refused it): no ack will come,
      // so the credits come back here.
      if (p) {
        p->credits.release(op->credit_bytes);
        p->in_flight = p->credits.in_flight();
      }
      if (!(closing_now_ && status == UCS_ERR_CANCELED))
        log("send to peer '{}' failed: {}", p ? p->name : std::string("?"), status_text(status));
      result = make_error(errc::io_error, "data plane: send to peer '{}' failed: {}",
                          p ? p->name : std::string("?"), status_text(status));
      wake();
    }
    if (op->done)
      op->done(std::move(result));
  }

  expected<peer_id> do_connect(std::string name, const std::vector<std::byte>& address) {
    peer* p = nullptr;
    {
      std::lock_guard guard(mutex_);
      for (auto& q : peers_)
        if (q->name == name)
          p = q.get();
      if (p && p->own_ep)
        return p->id;
      if (!p)
        p = add_peer(name);
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    // Error-handling mode NONE, on purpose: in UCX 1.13 PEER mode removes the
    // zero-copy rendezvous lanes (UCX then copies in user space) and over
    // shared memory needs extra keepalive settings (API-NOTES). A dead peer
    // is noticed by the control plane (CAF down_msg, 2-3 ms), which calls
    // disconnect() to force-close the endpoint.
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucp_ep_h ep = nullptr;
    if (auto s = ucp_ep_create(worker_, &params, &ep); s != UCS_OK)
      return make_error(errc::io_error, "data plane: ucp_ep_create to '{}': {}", name,
                        status_text(s));
    {
      std::lock_guard guard(mutex_);
      p->own_ep = ep;
      p->closed = false;
      sends_waiting_ = true;
    }
    // What the peer sends back on its side of this link arrives with our
    // endpoint as the reply endpoint; we trust it because the control plane
    // gave us its address.
    by_reply_ep_[ep] = p->id;
    // Hello: who we are, the job token, and our id for this link (the peer
    // echoes it in acks so its credits find our peer record).
    std::vector<std::byte> header(sizeof(hello_header) + options_.node_name.size());
    hello_header h{data_plane_wire::magic, options_.token, p->id,
                   static_cast<std::uint32_t>(options_.node_name.size()), 0};
    std::memcpy(header.data(), &h, sizeof h);
    std::memcpy(header.data() + sizeof h, options_.node_name.data(), options_.node_name.size());
    send_control(ep, data_plane_wire::hello_am, std::move(header));
    return p->id;
  }

  peer* add_peer(std::string name) { // requires mutex_
    peers_.push_back(std::make_unique<peer>(options_.credit_window_bytes));
    auto* p = peers_.back().get();
    p->id = static_cast<peer_id>(peers_.size());
    p->name = std::move(name);
    p->trace_name = trace::intern(p->name);
    return p;
  }

  void send_control(ucp_ep_h ep, unsigned id, std::vector<std::byte> header) {
    auto op = std::make_unique<control_op>();
    op->header = std::move(header);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = [](void* request, ucs_status_t, void* user_data) {
      ucp_request_free(request);
      delete static_cast<control_op*>(user_data);
    };
    param.user_data = op.get();
    auto* request =
        ucp_am_send_nbx(ep, id, op->header.data(), op->header.size(), nullptr, 0, &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
      op.release(); // freed with the request in the callback
    } else if (UCS_PTR_IS_ERR(request) && !closing_now_) {
      log("control message {:#x} failed: {}", id, status_text(UCS_PTR_STATUS(request)));
    }
  }

  // -- AM handlers (transport thread, inside ucp_worker_progress) -------------

  /// The peer whose endpoint sent this AM (from its hello), or nullptr.
  peer* sender_of(const ucp_am_recv_param_t* param) {
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
      return nullptr;
    auto it = by_reply_ep_.find(param->reply_ep);
    return it == by_reply_ep_.end() ? nullptr : find_locked(it->second);
  }

  std::string describe(const ucp_am_recv_param_t* param) {
    if (auto* p = sender_of(param))
      return fmt::format("'{}'", p->name);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
      return fmt::format("<endpoint {} without hello>", static_cast<void*>(param->reply_ep));
    return "<anonymous endpoint>";
  }

  static ucs_status_t on_hello_am(void* arg, const void* header, std::size_t header_length,
                                  void*, std::size_t, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<impl*>(arg);
    hello_header h{};
    if (header_length < sizeof h || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
      self->drop(param, self->stats_.dropped_malformed, "hello is too short or anonymous");
      return UCS_OK;
    }
    std::memcpy(&h, header, sizeof h);
    if (h.magic != data_plane_wire::magic || h.name_bytes != header_length - sizeof h ||
        h.name_bytes == 0 || h.name_bytes > data_plane_wire::max_name_bytes) {
      self->drop(param, self->stats_.dropped_malformed,
                 fmt::format("hello is malformed (magic {:#x}, name of {} bytes in {})", h.magic,
                             h.name_bytes, header_length));
      return UCS_OK;
    }
    if (h.token != self->options_.token) {
      self->drop(param, self->stats_.dropped_bad_token,
                 h.token == 0 ? "hello carries no job token" : "hello carries a wrong job token");
      return UCS_OK;
    }
    std::string name(static_cast<const char*>(header) + sizeof h, h.name_bytes);
    peer* p = nullptr;
    {
      std::lock_guard guard(self->mutex_);
      for (auto& q : self->peers_)
        if (q->name == name)
          p = q.get();
      if (!p)
        p = self->add_peer(name);
      p->reply_ep = param->reply_ep;
      p->remote_id = h.sender_peer;
      p->closed = false;
      self->sends_waiting_ = true;
    }
    self->by_reply_ep_[param->reply_ep] = p->id;
    return UCS_OK;
  }

  static ucs_status_t on_ack_am(void* arg, const void* header, std::size_t header_length, void*,
                                std::size_t, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<impl*>(arg);
    ack_header a{};
    if (header_length != sizeof a)
      return UCS_OK;
    std::memcpy(&a, header, sizeof a);
    // The endpoint says which link the ack is for; the id echoed from our
    // hello is the fallback.
    auto* p = self->sender_of(param);
    if (!p && a.peer <= std::numeric_limits<peer_id>::max())
      p = self->find_locked(static_cast<peer_id>(a.peer));
    if (p) {
      p->credits.release(a.bytes);
      p->in_flight = p->credits.in_flight();
      std::lock_guard guard(self->mutex_);
      self->sends_waiting_ = true;
    }
    self->pump_all();
    return UCS_OK;
  }

  /// A tensor handed over by reference: every size in the frame is checked
  /// against the frame before anything is read, then the Cap'n Proto header
  /// and the token like a data frame; the region itself is on_arena's to
  /// validate against the mapping (arena_mapper::open).
  static ucs_status_t on_arena_am(void* arg, const void* header, std::size_t header_length,
                                  void*, std::size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<impl*>(arg);
    auto* from = self->sender_of(param);
    auto credit_bytes = header_length + length;
    auto reject = [&](std::uint64_t& counter, std::string reason) {
      self->drop(param, counter, "arena frame: " + std::move(reason));
      self->send_ack(from, credit_bytes);
      return UCS_OK;
    };
    arena_header h{};
    if (header_length < sizeof h)
      return reject(self->stats_.dropped_malformed,
                    fmt::format("is {} bytes but must be at least {}", header_length, sizeof h));
    std::memcpy(&h, header, sizeof h);
    if (h.magic != data_plane_wire::magic || length != 0 || h.name_bytes == 0 ||
        h.name_bytes > data_plane_wire::max_arena_name_bytes || h.header_bytes == 0 ||
        h.header_bytes > data_plane_wire::max_arena_header_bytes ||
        std::uint64_t{h.name_bytes} + h.header_bytes != header_length - sizeof h)
      return reject(self->stats_.dropped_malformed,
                    fmt::format("malformed (magic {:#x}, name {} bytes in [1, {}], header {} bytes "
                                "in [1, {}], frame {} bytes, data {} bytes)",
                                h.magic, h.name_bytes, data_plane_wire::max_arena_name_bytes,
                                h.header_bytes, data_plane_wire::max_arena_header_bytes,
                                header_length, length));
    auto* bytes = static_cast<const std::byte*>(header);
    arena_handoff handoff;
    handoff.region.arena.assign(reinterpret_cast<const char*>(bytes + sizeof h), h.name_bytes);
    handoff.region.offset = h.offset;
    handoff.region.length = h.length;
    handoff.header.assign(bytes + sizeof h + h.name_bytes, bytes + header_length);
    auto parsed = decode_header(handoff.header, self->decode_options_);
    if (!parsed) {
      auto& counter = parsed.error().code() == errc::size_limit_exceeded
                          ? self->stats_.dropped_oversized
                          : self->stats_.dropped_malformed;
      return reject(counter, parsed.error().to_string());
    }
    if (parsed->meta.token != self->options_.token)
      return reject(self->stats_.dropped_bad_token, parsed->meta.token == 0
                                                        ? "frame carries no job token"
                                                        : "frame carries a wrong job token");
    if (parsed->byte_count != h.length)
      return reject(self->stats_.dropped_malformed,
                    fmt::format("region is {} bytes but the header's byteCount is {}", h.length,
                                parsed->byte_count));
    if (!from)
      return reject(self->stats_.dropped_unknown_peer, "the endpoint never said hello");
    if (!self->options_.on_arena)
      return reject(self->stats_.dropped_malformed, "this node accepts no handoffs by reference");
    {
      std::lock_guard guard(self->mutex_);
      ++self->stats_.arena_handoffs_received;
    }
    trace::data_read(self->trace_self_, from->trace_name, h.length, parsed->meta.flow_id,
                     trace::now_ns());
    try {
      self->options_.on_arena(from->id, std::move(handoff));
    } catch (const std::exception& e) {
      self->log("the arena handler threw on a handoff from '{}': {}", from->name, e.what());
    }
    self->send_ack(from, credit_bytes);
    return UCS_OK;
  }

  static ucs_status_t on_release_am(void* arg, const void* header, std::size_t header_length,
                                    void*, std::size_t, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<impl*>(arg);
    release_header r{};
    if (header_length < sizeof r) {
      self->drop(param, self->stats_.dropped_malformed, "release is too short");
      return UCS_OK;
    }
    std::memcpy(&r, header, sizeof r);
    if (r.magic != data_plane_wire::magic || r.name_bytes == 0 ||
        r.name_bytes > data_plane_wire::max_arena_name_bytes ||
        r.name_bytes != header_length - sizeof r) {
      self->drop(param, self->stats_.dropped_malformed,
                 fmt::format("release is malformed (magic {:#x}, name of {} bytes in {})", r.magic,
                             r.name_bytes, header_length));
      return UCS_OK;
    }
    if (r.token != self->options_.token) {
      self->drop(param, self->stats_.dropped_bad_token,
                 r.token == 0 ? "release carries no job token" : "release carries a wrong job token");
      return UCS_OK;
    }
    auto* from = self->sender_of(param);
    if (!from) {
      self->drop(param, self->stats_.dropped_unknown_peer, "release: the endpoint never said hello");
      return UCS_OK;
    }
    arena_ref region{std::string(static_cast<const char*>(header) + sizeof r, r.name_bytes),
                     r.offset, r.length};
    {
      std::lock_guard guard(self->mutex_);
      ++self->stats_.releases_received;
    }
    if (self->options_.on_release) {
      try {
        self->options_.on_release(from->id, region);
      } catch (const std::exception& e) {
        self->log("the release handler threw on a release from '{}': {}", from->name, e.what());
      }
    }
    return UCS_OK;
  }

  static ucs_status_t on_goodbye_am(void* arg, const void* header, std::size_t header_length,
                                    void*, std::size_t, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<impl*>(arg);
    goodbye_header g{};
    if (header_length != sizeof g)
      return UCS_OK;
    std::memcpy(&g, header, sizeof g);
    if (g.magic != data_plane_wire::magic || g.token != self->options_.token)
      return UCS_OK;
    if (auto* p = self->sender_of(param))
      self->drop_peer(*p, "it is closing", false);
    return UCS_OK;
  }

  /// The peer announced it is closing, or the control plane says it died:
  /// fail its queued sends and forget its endpoints; the errors UCX reports
  /// for them from now on are expected and ignored.
  void drop_peer(peer& p, std::string_view why, bool force_close) {
    std::deque<std::unique_ptr<send_op>> failed;
    {
      std::lock_guard guard(mutex_);
      p.closed = true;
      failed.swap(p.queued);
    }
    for (auto& op : failed)
      if (op->done)
        op->done(make_error(errc::io_error, "data plane: peer '{}' is gone: {}", p.name, why));
    if (p.reply_ep)
      by_reply_ep_.erase(p.reply_ep);
    p.reply_ep = nullptr;
    if (force_close && p.own_ep) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      auto* request = ucp_ep_close_nbx(p.own_ep, &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
        while (ucp_request_check_status(request) == UCS_INPROGRESS)
          ucp_worker_progress(worker_);
        ucp_request_free(request);
      }
      by_reply_ep_.erase(p.own_ep);
      p.own_ep = nullptr;
    }
  }

  /// Validates a data AM header before anything else. Returns the parsed
  /// header, or nothing after logging and counting the drop.
  static ucs_status_t on_data_am(void* arg, const void* header, std::size_t header_length,
                                 void* data, std::size_t length,
                                 const ucp_am_recv_param_t* param) {
    return static_cast<impl*>(arg)->receive(header, header_length, data, length, param);
  }

  ucs_status_t receive(const void* header, std::size_t header_length, void* data,
                       std::size_t length, const ucp_am_recv_param_t* param) {
    const auto arrived_ns = trace::now_ns();
    bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    auto credit_bytes = header_length + length;
    // A rejected rendezvous frame is refused through UCX (the sender's send
    // fails and it returns its credits); a rejected eager one is acked.
    auto reject = [&](std::uint64_t& counter, std::string reason) {
      drop(param, counter, std::move(reason));
      if (rendezvous)
        return UCS_ERR_REJECTED;
      send_ack(sender_of(param), credit_bytes);
      return UCS_OK;
    };
    std::span<const std::byte> header_span(static_cast<const std::byte*>(header), header_length);
    auto parsed = decode_header(header_span, decode_options_);
    if (!parsed) {
      auto& counter = parsed.error().code() == errc::size_limit_exceeded
                          ? stats_.dropped_oversized
                          : stats_.dropped_malformed;
      return reject(counter, parsed.error().to_string());
    }
    if (parsed->meta.token != options_.token)
      return reject(stats_.dropped_bad_token, parsed->meta.token == 0
                                                  ? "frame carries no job token"
                                                  : "frame carries a wrong job token");
    if (length != parsed->byte_count)
      return reject(stats_.dropped_malformed,
                    fmt::format("payload is {} bytes but the header's byteCount is {}", length,
                                parsed->byte_count));
    auto* from = sender_of(param);
    if (!from)
      return reject(stats_.dropped_unknown_peer, "the endpoint never said hello");

    auto op = std::make_unique<receive_op>();
    op->owner = this;
    op->from = from->id;
    op->start_ns = arrived_ns;
    op->header_bytes = header_length;
    op->header.resize((header_length + 7) / 8);
    std::memcpy(op->header.data(), header, header_length);
    op->credit_bytes = credit_bytes;

    if (rendezvous) {
      // Pull the payload straight into a pooled, aligned buffer that the
      // delivered tensor will alias.
      op->buffer = lend_buffer(length);
      ucp_request_param_t rp{};
      rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE;
      rp.datatype = ucp_dt_make_contig(1);
      rp.cb.recv_am = &impl::on_receive_done;
      rp.user_data = op.get();
      auto* request = ucp_am_recv_data_nbx(worker_, data, op->buffer->data(), length, &rp);
      {
        std::lock_guard guard(mutex_);
        ++stats_.rendezvous_receives;
      }
      if (request == nullptr) {
        deliver(std::move(op), true);
      } else if (UCS_PTR_IS_ERR(request)) {
        log("receiving a payload from '{}' failed: {}", from->name,
            status_text(UCS_PTR_STATUS(request)));
        send_ack(from, credit_bytes);
      } else {
        ++rendezvous_receives_pending_;
        op.release(); // owned by UCX until on_receive_done, which frees the request
      }
      return UCS_INPROGRESS;
    }

    {
      std::lock_guard guard(mutex_);
      ++stats_.eager_receives;
    }
    bool persistent = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    if (length > 0 && persistent &&
        reinterpret_cast<std::uintptr_t>(data) % storage::alignment == 0) {
      // UCX lets us keep its buffer: the tensor aliases it, and its deleter
      // gives it back (ucp_am_data_release, on the transport thread).
      auto self = shared_from_this();
      op->buffer = storage::wrap(data, length, device::cpu(),
                                 [self](void* p) { self->release_data(p); });
      deliver(std::move(op), true);
      return UCS_INPROGRESS;
    }
    op->buffer = lend_buffer(length);
    if (length > 0)
      std::memcpy(op->buffer->data(), data, length);
    {
      std::lock_guard guard(mutex_);
      ++stats_.eager_copies;
    }
    deliver(std::move(op), false);
    return UCS_OK; // UCX keeps (and frees) its own copy
  }

  static void on_receive_done(void* request, ucs_status_t status, std::size_t,
                              void* user_data) {
    ucp_request_free(request);
    std::unique_ptr<receive_op> op(static_cast<receive_op*>(user_data));
    auto* self = op->owner;
    --self->rendezvous_receives_pending_;
    if (status != UCS_OK) {
      auto* p = self->find_locked(op->from);
      self->log("receiving a payload from '{}' failed: {}", p ? p->name : std::string("?"),
                status_text(status));
      self->send_ack(p, op->credit_bytes);
      return;
    }
    self->deliver(std::move(op), true);
  }

  /// Decodes (the header was validated already; this builds the tensor over
  /// the buffer), hands the message to the receive handler, then acks.
  void deliver(std::unique_ptr<receive_op> op, bool zero_copy) {
    auto* p = find_locked(op->from);
    auto* buffer_start = op->buffer->data();
    std::span<const std::byte> header(reinterpret_cast<const std::byte*>(op->header.data()),
                                      op->header_bytes);
    auto decoded = decode(header, std::move(op->buffer), decode_options_);
    if (!decoded) {
      std::lock_guard guard(mutex_);
      ++stats_.dropped_malformed;
    }
    if (!decoded) {
      log("dropped a message from '{}': {}", p ? p->name : std::string("?"),
          decoded.error().to_string());
      send_ack(p, op->credit_bytes);
      return;
    }
    tensor_message message;
    message.meta = std::move(decoded->meta);
    message.flow_id = message.meta.flow_id;
    message.meta.token = 0; // the job's secret stays in the data plane
    message.value = std::move(decoded->value);
    {
      std::lock_guard guard(mutex_);
      ++stats_.messages_received;
      stats_.bytes_received += message.value.memory()->bytes();
      if (zero_copy && message.value.raw_data() == buffer_start)
        ++stats_.zero_copy_deliveries;
    }
    trace::data_read(trace_self_, p ? p->trace_name : trace::name_id{}, message.value.nbytes(),
                     message.flow_id, op->start_ns);
    // Ack after the handler: credits mean "delivered", not "arrived".
    try {
      options_.on_receive(op->from, std::move(message));
    } catch (const std::exception& e) {
      log("the receive handler threw on a message from '{}': {}",
          p ? p->name : std::string("?"), e.what());
    }
    send_ack(p, op->credit_bytes);
  }

  /// Owes `p` an ack for `bytes`: acks are coalesced per peer and sent by
  /// flush_acks() when the progress burst that produced them ends (before
  /// the thread can sleep), or at once after max_coalesced_acks messages or
  /// max_coalesced_ack_bytes, so a credit is never held back longer than
  /// one burst and a long burst (streaming put data) still returns credits.
  void send_ack(peer* p, std::size_t bytes) {
    if (!p || closing_now_)
      return;
    if (!p->ack_listed) {
      if (acks_owed_.empty())
        acks_owed_since_ = clock_type::now();
      p->ack_listed = true;
      acks_owed_.push_back(p);
    }
    p->ack_bytes += bytes;
    if (++p->ack_messages >= max_coalesced_acks || p->ack_bytes >= max_coalesced_ack_bytes)
      flush_ack(*p);
  }

  void flush_acks() {
    for (auto* p : acks_owed_) {
      p->ack_listed = false;
      flush_ack(*p);
    }
    acks_owed_.clear();
  }

  void flush_ack(peer& p) {
    if (p.ack_messages == 0)
      return;
    ack_header a{p.remote_id, p.ack_bytes, p.ack_messages};
    p.ack_bytes = 0;
    p.ack_messages = 0;
    auto* ep = p.reply_ep ? p.reply_ep : p.own_ep;
    if (!ep || closing_now_)
      return;
    std::vector<std::byte> header(sizeof a);
    std::memcpy(header.data(), &a, sizeof a);
    send_control(ep, data_plane_wire::ack_am, std::move(header));
  }

  void drop(const ucp_am_recv_param_t* param, std::uint64_t& counter, std::string reason) {
    {
      std::lock_guard guard(mutex_);
      ++counter;
    }
    log("dropped a message from peer {}: {}", describe(param), reason);
  }

  // -- receive buffers -------------------------------------------------------

  /// A 64-byte aligned buffer from the host allocator's cache; the tensor
  /// that aliases it returns it there when its last view goes away.
  std::shared_ptr<storage> lend_buffer(std::size_t bytes) {
    auto* memory = host_allocator::instance().allocate(bytes);
    {
      std::lock_guard guard(buffers_mutex_);
      lent_buffers_[reinterpret_cast<std::uintptr_t>(memory)] = bytes;
    }
    auto self = shared_from_this();
    return storage::wrap(memory, bytes, device::cpu(), [self, bytes](void* p) {
      {
        std::lock_guard guard(self->buffers_mutex_);
        self->lent_buffers_.erase(reinterpret_cast<std::uintptr_t>(p));
      }
      host_allocator::instance().deallocate(p, bytes);
    });
  }

  /// Gives UCX's persistent eager data back, on the transport thread while
  /// it runs, directly once it has stopped (no other thread uses the worker
  /// then; release_mutex_ serialises the deleters).
  void release_data(void* data) {
    std::lock_guard guard(release_mutex_);
    if (thread_running_) {
      releases_.push_back(data);
      wake();
    } else {
      ucp_am_data_release(worker_, data);
    }
  }

  // -- shutdown ----------------------------------------------------------------

  /// Announce, then close: a goodbye to every peer first, so their side
  /// ignores the endpoint errors that follow; then flush-close our
  /// endpoints (bounded), force-closing what does not finish in time.
  void shutdown() {
    closing_now_ = true;
    std::vector<peer*> all;
    {
      std::lock_guard guard(mutex_);
      for (auto& p : peers_)
        all.push_back(p.get());
    }
    for (auto* p : all) {
      std::deque<std::unique_ptr<send_op>> failed;
      {
        std::lock_guard guard(mutex_);
        failed.swap(p->queued);
        p->closed = true;
      }
      for (auto& op : failed)
        if (op->done)
          op->done(make_error(errc::io_error, "data plane: closed before sending"));
      // Only over our own endpoints: a reply endpoint belongs to UCX, and a
      // peer that vanished without a goodbye may have taken it with it.
      if (auto* ep = p->own_ep) {
        goodbye_header g{data_plane_wire::magic, options_.token, p->id};
        std::vector<std::byte> header(sizeof g);
        std::memcpy(header.data(), &g, sizeof g);
        send_control(ep, data_plane_wire::goodbye_am, std::move(header));
      }
    }
    std::vector<ucs_status_ptr_t> closing;
    for (auto* p : all) {
      if (!p->own_ep)
        continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = 0; // flush: the goodbye and any sends in flight go first
      auto* request = ucp_ep_close_nbx(p->own_ep, &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request))
        closing.push_back(request);
      p->own_ep = nullptr;
    }
    auto deadline = clock_type::now() + std::chrono::seconds(2);
    for (auto* request : closing) {
      // The peer may close at the same time: its endpoint-closed error shows
      // up as this request's status and is expected here.
      while (ucp_request_check_status(request) == UCS_INPROGRESS &&
             clock_type::now() < deadline)
        ucp_worker_progress(worker_);
      if (ucp_request_check_status(request) == UCS_INPROGRESS)
        ucp_request_cancel(worker_, request);
      ucp_request_free(request);
    }
    for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
    }
    std::vector<void*> releases;
    {
      std::lock_guard guard(release_mutex_);
      thread_running_ = false;
      releases.swap(releases_);
    }
    for (auto* data : releases)
      ucp_am_data_release(worker_, data);
  }

  template <class... Ts> void log(fmt::format_string<Ts...> format, Ts&&... args) {
    fmt::print(stderr, "troupe data plane [{}]: {}\n", options_.node_name,
               fmt::format(format, std::forward<Ts>(args)...));
  }

  data_plane_options options_;
  trace::name_id trace_self_; // "<node>/ucx": the track of this data plane's transfers
  decode_options decode_options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::byte> address_;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  static constexpr int idle_progress_ms = 200;
  static constexpr std::chrono::seconds sweep_interval{1};
  std::optional<detail::ucx_handshake_deadline> handshake_deadline_; // transport thread after init
  std::thread thread_;

  mutable std::mutex mutex_; // peers_ (the list and each queue), commands_, stats_
  std::vector<std::unique_ptr<peer>> peers_;
  std::vector<std::function<void()>> commands_;
  std::vector<std::pair<peer_id, std::vector<std::byte>>> releases_out_; // release headers to send
  data_plane_stats stats_;
  bool sends_waiting_ = false;
  bool closing_ = false;
  bool running_ = false;

  // transport thread only
  static constexpr std::size_t max_coalesced_acks = 16;
  static constexpr std::size_t max_coalesced_ack_bytes = std::size_t{256} << 10;
  static constexpr std::chrono::microseconds max_ack_delay{200};
  std::vector<peer*> acks_owed_; // peers with ack_messages > 0
  clock_type::time_point acks_owed_since_; // when acks_owed_ last became non-empty
  std::unordered_map<ucp_ep_h, peer_id> by_reply_ep_;
  bool closing_now_ = false;
  // Rendezvous sends posted and receives pulling, not yet complete in UCX
  // (written by the transport thread only; atomic for stats()).
  std::atomic<std::uint64_t> rendezvous_sends_pending_{0};
  std::atomic<std::uint64_t> rendezvous_receives_pending_{0};

  mutable std::mutex buffers_mutex_;
  std::map<std::uintptr_t, std::size_t> lent_buffers_;

  std::mutex release_mutex_;
  std::vector<void*> releases_;
  bool thread_running_ = true;
};

expected<std::unique_ptr<data_plane>> data_plane::start(data_plane_options options) {
  auto state = std::make_shared<impl>(std::move(options));
  if (auto ok = state->init(); !ok)
    return ok.error();
  return std::unique_ptr<data_plane>(new data_plane(std::move(state)));
}

data_plane::data_plane(std::shared_ptr<impl> state) : impl_(std::move(state)) {}

data_plane::~data_plane() { close(); }

std::vector<std::byte> data_plane::address() const { return impl_->address(); }

expected<peer_id> data_plane::connect(std::string peer_name, std::span<const std::byte> address) {
  return impl_->connect(std::move(peer_name), address);
}

expected<peer_id> data_plane::find_peer(const std::string& name) const {
  return impl_->find_peer(name);
}

std::string data_plane::peer_name(peer_id peer) const { return impl_->peer_name(peer); }

expected<void> data_plane::send(peer_id peer, tensor_message message, completion_callback done) {
  return impl_->send(peer, std::move(message), std::move(done));
}

expected<void> data_plane::send_by_reference(peer_id peer, tensor_message message,
                                             const arena_ref& region, completion_callback done) {
  return impl_->send_by_reference(peer, std::move(message), region, std::move(done));
}

void data_plane::send_release(peer_id peer, const arena_ref& region) {
  impl_->send_release(peer, region);
}

void data_plane::disconnect(peer_id peer) { impl_->disconnect(peer); }

data_plane_stats data_plane::stats() const { return impl_->stats(); }

std::size_t data_plane::in_flight_bytes(peer_id peer) const {
  return impl_->in_flight(peer, false);
}

std::size_t data_plane::max_in_flight_bytes(peer_id peer) const {
  return impl_->in_flight(peer, true);
}

bool data_plane::is_receive_buffer(const void* p) const { return impl_->is_receive_buffer(p); }

void data_plane::close() { impl_->close(); }

} // namespace troupe::actors

