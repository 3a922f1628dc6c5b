// The data plane's transport: start-up (UCX context, worker, AM handlers,
// the event fds), the transport thread's loop, connecting and dropping
// peers, shutdown, and data_plane's own members. The send path is
// data_plane_send.cpp, what arrives data_plane_receive.cpp; the class they
// share is declared in data_plane_impl.hpp. Below: the flow control over
// one edge, which all of them carry out, and why it is tuned as it is.
#include "troupe/actors/data_plane.hpp"

#include <sys/epoll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <set>

#include "data_plane_impl.hpp"
#include "heap_retention.hpp"

// Flow control, step by step (one edge: sender S -> receiver R):
//  1. S's send() encodes the message (header frame + a span of the tensor's
//     memory) and appends it to S's bounded queue for R; a full queue is
//     refused at once (back-pressure to the caller, never an unbounded queue).
//     [send(), enqueue(): data_plane_send.cpp; the queue: send_queue in
//     data_plane_send_queue.hpp]
//  2. S's transport thread takes messages from the queue while R's credit
//     window has room: each takes header + payload bytes of credit, and is
//     handed to UCX (ucp_am_send_nbx); its header and tensor live in the
//     send_op until UCX completes it. [drain() below, then pump_all() and
//     post_send(): data_plane_send.cpp; send_queue::take_ready()]
//  3. R's AM handler validates the header and token before anything else,
//     then pulls the payload (rendezvous) into a pooled 64-byte aligned
//     buffer, or keeps / copies the eager data. [receive():
//     data_plane_receive.cpp; the checks: data_plane_wire.hpp; the buffers:
//     data_plane_receive_pool.hpp]
//  4. R delivers the tensor (aliasing that buffer) to its receive handler,
//     then sends an ack AM to S carrying the bytes (header + payload, both
//     known to R from the AM itself) — also for a message it dropped, so a
//     rejected frame does not leak S's credits. A rejected *rendezvous*
//     frame is refused through UCX instead (the handler returns an error and
//     S's send completes with it); then S gives the credits back itself.
//     [deliver(), send_ack(): data_plane_receive.cpp; complete_send():
//     data_plane_send.cpp]
//  5. S's ack handler returns the credits and posts more from the queue.
//     [on_ack_am(): data_plane_receive.cpp]
// So at most `credit_window_bytes` are unacknowledged per edge, plus
// `max_queued_sends` messages waiting, plus what the receive handler holds.
// Two refinements, both only tighter bounds:
//  - At most `max_rendezvous_in_flight` (4) rendezvous sends per peer are
//    in UCX at once (posted, send not yet complete), whatever the window.
//    [send_queue::take_ready() and sent()]
//  - R coalesces acks per peer: it sends one ack (bytes, messages) when 16
//    messages or 256 KiB are owed, when its thread goes idle (always before
//    it can sleep), or when the oldest owed ack has waited 200 us, so a
//    credit is never held back longer than that. Replies that the delivered
//    messages caused go out before the acks. [ack_coalescer in
//    data_plane_acks.hpp; the idle and overdue flushes in run() below]
//
// Measured: why the transport is tuned as it is, a line or two each (the
// figures, how they were taken, and what else was tried are in
// docs/performance.md, "Data plane transport: measurement history"):
//  - At most 4 rendezvous in flight per peer: with 64 in flight (1 MiB
//    messages in the 64 MiB window) 1 MiB was slower over tcp and over
//    shared memory on two cores; larger messages are bounded by the window.
//  - Acks coalesced: an ack per message cost 4 KiB messages about a third
//    of their rate over tcp. The 256 KiB bound matters: acking only at the
//    end of a progress burst halved 16 MiB over tcp (a stream of rendezvous
//    data keeps the burst from ending).
//  - Replies before acks, acks when the thread goes idle: over tcp an ack
//    is a send() of its own, and sent first it delayed the reply.
//  - spin_before_sleep (50 us, yielding the core between polls): a reply
//    that comes back within it skips waking a sleeping thread (median round
//    trip about halved); a spin that does not yield takes the core the
//    copies need, and an idle node still sleeps after it.
//  - spin_while_transferring (1 ms since the last progress): a sleeping
//    thread resumes late when the socket drains mid-transfer (tcp 16 MiB
//    faster).
//  - To other hosts, eager up to 4 MiB (network_eager_bytes): a handshake
//    waits behind the data queued on the same TCP connection, which halved
//    a ring's busbw on a 1 Gbit/s link (docs/scaling.md).
//  - Kept: the 64 KiB rendezvous threshold (eager at 1 MiB was slower) and
//    UCX's defaults; not kept: the sending thread posting eager sends itself
//    under a worker mutex (no faster round trip, 4 KiB throughput halved).

namespace troupe::actors {

// -- start-up -----------------------------------------------------------------

data_plane::impl::impl(data_plane_options options) : options_(std::move(options)) {
  decode_options_.max_payload_bytes = options_.max_message_bytes;
  trace_self_ = trace::intern(options_.node_name + "/ucx");
}

data_plane::impl::~impl() {
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

expected<void> data_plane::impl::init() {
  if (options_.token == 0)
    return make_error(errc::invalid_argument,
                      "data plane: the job token must not be 0 (0 marks a frame without one)");
  if (!options_.on_receive)
    return make_error(errc::invalid_argument, "data plane: on_receive is required");
  if (options_.credit_window_bytes == 0 || options_.max_queued_sends == 0)
    return make_error(errc::invalid_argument,
                      "data plane: credit window and send queue must be positive");
  // Before UCX allocates anything: its eager assembly blocks come from malloc.
  detail::keep_freed_heap(options_.network_eager_bytes + (std::size_t{64} << 10), options_.keep_freed_heap_bytes);
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

// -- calls from any thread ----------------------------------------------------

expected<peer_id> data_plane::impl::connect(std::string name, std::span<const std::byte> address,
                                           bool on_another_host) {
  if (name.empty() || name.size() > data_plane_wire::max_name_bytes)
    return make_error(errc::invalid_argument, "data plane: peer name '{}' is empty or too long",
                      name);
  if (address.empty())
    return make_error(errc::invalid_argument, "data plane: empty address for peer '{}'", name);
  auto result = std::make_shared<std::promise<expected<peer_id>>>();
  auto future = result->get_future();
  std::vector<std::byte> copy(address.begin(), address.end());
  if (auto ok = post([this, name, copy = std::move(copy), result, on_another_host]() mutable {
        result->set_value(do_connect(std::move(name), copy, on_another_host));
      });
      !ok)
    return ok.error();
  if (future.wait_for(std::chrono::seconds(5)) != std::future_status::ready)
    return make_error(errc::io_error, "data plane: connecting to '{}' timed out", name);
  return future.get();
}

void data_plane::impl::disconnect(peer_id who) {
  (void)post([this, who] {
    if (auto* p = find_locked(who))
      drop_peer(*p, "disconnected by the control plane", true);
  });
}

expected<peer_id> data_plane::impl::find_peer(const std::string& name) const {
  std::lock_guard guard(mutex_);
  for (auto& p : peers_)
    if (p->name == name)
      return p->id;
  return make_error(errc::invalid_argument, "data plane: no peer named '{}'", name);
}

std::string data_plane::impl::peer_name(peer_id who) const {
  std::lock_guard guard(mutex_);
  auto* p = const_cast<impl*>(this)->find(who);
  return p ? p->name : fmt::format("#{}", who);
}

data_plane_stats data_plane::impl::stats() const {
  std::lock_guard guard(mutex_);
  auto out = stats_;
  for (auto& p : peers_)
    out.max_in_flight_bytes =
        std::max<std::uint64_t>(out.max_in_flight_bytes, p->sends.high_water());
  out.rendezvous_in_progress = rendezvous_sends_pending_.load(std::memory_order_relaxed) +
                               rendezvous_receives_pending_.load(std::memory_order_relaxed);
  return out;
}

std::size_t data_plane::impl::in_flight(peer_id who, bool high) const {
  std::lock_guard guard(mutex_);
  auto* p = const_cast<impl*>(this)->find(who);
  if (!p)
    return 0;
  return high ? p->sends.high_water() : p->sends.in_flight();
}

void data_plane::impl::close() {
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

// -- helpers for other threads ------------------------------------------------

expected<void> data_plane::impl::post(std::function<void()> command) {
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

// -- transport thread ---------------------------------------------------------

void data_plane::impl::run() {
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
    // keeps this thread busy: none waits longer than max_delay (data_plane_acks.hpp).
    if (acks_.overdue())
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
void data_plane::impl::sweep_silent_connections(clock_type::time_point now) {
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

bool data_plane::impl::work_waiting() {
  std::lock_guard guard(mutex_);
  return sends_waiting_ || !commands_.empty() || closing_;
}

/// Runs queued commands and posts queued sends that have credits; false
/// once close() was called.
bool data_plane::impl::drain() {
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

// -- peers (transport thread) -------------------------------------------------

expected<peer_id> data_plane::impl::do_connect(std::string name, const std::vector<std::byte>& address,
                                              bool on_another_host) {
  peer* p = nullptr;
  {
    std::lock_guard guard(mutex_);
    for (auto& q : peers_)
      if (q->name == name)
        p = q.get();
    if (!p)
      p = add_peer(name);
    p->on_another_host = on_another_host;
    if (p->own_ep)
      return p->id;
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
  send_control(ep, data_plane_wire::hello_am,
               detail::write_hello(options_.token, p->id, options_.node_name));
  return p->id;
}

data_plane::impl::peer* data_plane::impl::add_peer(std::string name) { // requires mutex_
  peers_.push_back(std::make_unique<peer>(options_));
  auto* p = peers_.back().get();
  p->id = static_cast<peer_id>(peers_.size());
  p->name = std::move(name);
  p->trace_name = trace::intern(p->name);
  return p;
}

void data_plane::impl::send_control(ucp_ep_h ep, unsigned id,
                                    std::vector<std::byte> header) {
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

/// The peer announced it is closing, or the control plane says it died:
/// fail its queued sends and forget its endpoints; the errors UCX reports
/// for them from now on are expected and ignored.
void data_plane::impl::drop_peer(peer& p, std::string_view why, bool force_close) {
  std::deque<std::unique_ptr<send_op>> failed;
  {
    std::lock_guard guard(mutex_);
    p.closed = true;
    failed = p.sends.take_all();
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

// -- shutdown -----------------------------------------------------------------

/// Announce, then close: a goodbye to every peer still here first, so
/// their side ignores the endpoint errors that follow; then flush-close our
/// endpoints to them (bounded), force-closing what does not finish in
/// time. Endpoints to peers already gone (they said goodbye, or the control
/// plane reported them lost) are force-closed at once: a flush towards a
/// process that has exited only ends in UCX's "Endpoint timeout" error,
/// which it prints.
void data_plane::impl::shutdown() {
  closing_now_ = true;
  std::vector<peer*> all;
  std::vector<bool> gone;
  {
    std::lock_guard guard(mutex_);
    for (auto& p : peers_) {
      all.push_back(p.get());
      gone.push_back(p->closed);
    }
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto* p = all[i];
    std::deque<std::unique_ptr<send_op>> failed;
    {
      std::lock_guard guard(mutex_);
      failed = p->sends.take_all();
      p->closed = true;
    }
    for (auto& op : failed)
      if (op->done)
        op->done(make_error(errc::io_error, "data plane: closed before sending"));
    // Only over our own endpoints: a reply endpoint belongs to UCX, and a
    // peer that vanished without a goodbye may have taken it with it.
    if (auto* ep = p->own_ep; ep != nullptr && !gone[i]) {
      send_control(ep, data_plane_wire::goodbye_am, detail::write_goodbye(options_.token, p->id));
    }
  }
  std::vector<ucs_status_ptr_t> closing;
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto* p = all[i];
    if (!p->own_ep)
      continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // Flush for a peer still here: the goodbye and any sends in flight go first.
    param.flags = gone[i] ? UCP_EP_CLOSE_FLAG_FORCE : 0;
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

// -- data_plane ---------------------------------------------------------------

expected<std::unique_ptr<data_plane>> data_plane::start(data_plane_options options) {
  auto state = std::make_shared<impl>(std::move(options));
  if (auto ok = state->init(); !ok)
    return ok.error();
  return std::unique_ptr<data_plane>(new data_plane(std::move(state)));
}

data_plane::data_plane(std::shared_ptr<impl> state) : impl_(std::move(state)) {}

data_plane::~data_plane() { close(); }

std::vector<std::byte> data_plane::address() const { return impl_->address(); }

expected<peer_id> data_plane::connect(std::string peer_name, std::span<const std::byte> address,
                                      bool on_another_host) {
  return impl_->connect(std::move(peer_name), address, on_another_host);
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

