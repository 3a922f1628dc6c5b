// What arrives on the data plane (steps 3 and 4 of "Flow control, step by
// step" in data_plane.cpp, and step 5's ack handler): the UCX active-message
// handlers for hello, data, ack, arena, release and goodbye frames, which
// run on the transport thread inside ucp_worker_progress. Each checks its
// frame (data_plane_wire.hpp) and its sender before anything else; a data
// frame's payload lands in a receive buffer or UCX's own, is delivered to
// the receive handler, and is then acked. Apart from data_plane.cpp so
// that a message's way in reads in one file.
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>

#include "data_plane_impl.hpp"

namespace troupe::actors {

namespace {

std::span<const std::byte> bytes_of(const void* header, std::size_t length) {
  return {static_cast<const std::byte*>(header), length};
}

} // namespace

/// The peer whose endpoint sent this AM (from its hello), or nullptr.
data_plane::impl::peer* data_plane::impl::sender_of(const ucp_am_recv_param_t* param) {
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
    return nullptr;
  auto it = by_reply_ep_.find(param->reply_ep);
  return it == by_reply_ep_.end() ? nullptr : find_locked(it->second);
}

std::string data_plane::impl::describe(const ucp_am_recv_param_t* param) {
  if (auto* p = sender_of(param))
    return fmt::format("'{}'", p->name);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
    return fmt::format("<endpoint {} without hello>", static_cast<void*>(param->reply_ep));
  return "<anonymous endpoint>";
}

// -- control frames -----------------------------------------------------------

ucs_status_t data_plane::impl::on_hello_am(void* arg, const void* header,
                                           std::size_t header_length, void*, std::size_t,
                                           const ucp_am_recv_param_t* param) {
  auto* self = static_cast<impl*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    self->drop(param, &data_plane_stats::dropped_malformed, "hello is too short or anonymous");
    return UCS_OK;
  }
  auto hello = detail::read_hello(bytes_of(header, header_length), self->options_.token);
  if (auto* bad = std::get_if<detail::frame_rejection>(&hello)) {
    self->drop(param, bad->counter, std::move(bad->reason));
    return UCS_OK;
  }
  auto& [name, sender_peer] = std::get<detail::hello_frame>(hello);
  peer* p = nullptr;
  {
    std::lock_guard guard(self->mutex_);
    for (auto& q : self->peers_)
      if (q->name == name)
        p = q.get();
    if (!p)
      p = self->add_peer(name);
    p->reply_ep = param->reply_ep;
    p->remote_id = sender_peer;
    p->closed = false;
    self->sends_waiting_ = true;
  }
  self->by_reply_ep_[param->reply_ep] = p->id;
  return UCS_OK;
}

ucs_status_t data_plane::impl::on_ack_am(void* arg, const void* header, std::size_t header_length,
                                         void*, std::size_t, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<impl*>(arg);
  auto a = detail::read_ack(bytes_of(header, header_length));
  if (!a)
    return UCS_OK;
  // The endpoint says which link the ack is for; the id echoed from our
  // hello is the fallback.
  auto* p = self->sender_of(param);
  if (!p && a->peer <= std::numeric_limits<peer_id>::max())
    p = self->find_locked(static_cast<peer_id>(a->peer));
  if (p) {
    p->sends.return_credits(a->bytes);
    std::lock_guard guard(self->mutex_);
    self->sends_waiting_ = true;
  }
  self->pump_all();
  return UCS_OK;
}

/// A tensor handed over by reference (its frame's checks:
/// detail::read_arena_frame); acked like a data frame, also when dropped.
ucs_status_t data_plane::impl::on_arena_am(void* arg, const void* header,
                                           std::size_t header_length, void*, std::size_t length,
                                           const ucp_am_recv_param_t* param) {
  auto* self = static_cast<impl*>(arg);
  auto* from = self->sender_of(param);
  auto credit_bytes = header_length + length;
  auto reject = [&](detail::drop_counter counter, std::string reason) {
    self->drop(param, counter, "arena frame: " + std::move(reason));
    self->send_ack(from, credit_bytes);
    return UCS_OK;
  };
  auto frame = detail::read_arena_frame(bytes_of(header, header_length), length,
                                        self->options_.token, self->decode_options_);
  if (auto* bad = std::get_if<detail::frame_rejection>(&frame))
    return reject(bad->counter, std::move(bad->reason));
  auto& [handoff, flow_id] = std::get<detail::arena_frame>(frame);
  if (!from)
    return reject(&data_plane_stats::dropped_unknown_peer, "the endpoint never said hello");
  if (!self->options_.on_arena)
    return reject(&data_plane_stats::dropped_malformed,
                  "this node accepts no handoffs by reference");
  {
    std::lock_guard guard(self->mutex_);
    ++self->stats_.arena_handoffs_received;
  }
  trace::data_read(self->trace_self_, from->trace_name, handoff.region.length, flow_id,
                   trace::now_ns());
  try {
    self->options_.on_arena(from->id, std::move(handoff));
  } catch (const std::exception& e) {
    self->log("the arena handler threw on a handoff from '{}': {}", from->name, e.what());
  }
  self->send_ack(from, credit_bytes);
  return UCS_OK;
}

ucs_status_t data_plane::impl::on_release_am(void* arg, const void* header,
                                             std::size_t header_length, void*, std::size_t,
                                             const ucp_am_recv_param_t* param) {
  auto* self = static_cast<impl*>(arg);
  auto release = detail::read_release(bytes_of(header, header_length), self->options_.token);
  if (auto* bad = std::get_if<detail::frame_rejection>(&release)) {
    self->drop(param, bad->counter, std::move(bad->reason));
    return UCS_OK;
  }
  auto* from = self->sender_of(param);
  if (!from) {
    self->drop(param, &data_plane_stats::dropped_unknown_peer,
               "release: the endpoint never said hello");
    return UCS_OK;
  }
  auto& region = std::get<arena_ref>(release);
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

ucs_status_t data_plane::impl::on_goodbye_am(void* arg, const void* header,
                                             std::size_t header_length, void*, std::size_t,
                                             const ucp_am_recv_param_t* param) {
  auto* self = static_cast<impl*>(arg);
  if (!detail::is_goodbye(bytes_of(header, header_length), self->options_.token))
    return UCS_OK;
  if (auto* p = self->sender_of(param))
    self->drop_peer(*p, "it is closing", false);
  return UCS_OK;
}

// -- data frames --------------------------------------------------------------

ucs_status_t data_plane::impl::on_data_am(void* arg, const void* header,
                                          std::size_t header_length, void* data,
                                          std::size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<impl*>(arg)->receive(header, header_length, data, length, param);
}

/// Checks the frame and its sender before anything else, then takes the
/// payload: pulls a rendezvous one into a receive buffer, keeps UCX's
/// persistent eager data when it is aligned, or copies it.
ucs_status_t data_plane::impl::receive(const void* header, std::size_t header_length, void* data,
                                       std::size_t length, const ucp_am_recv_param_t* param) {
  const auto arrived_ns = trace::now_ns();
  bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  auto credit_bytes = header_length + length;
  // A rejected rendezvous frame is refused through UCX (the sender's send
  // fails and it returns its credits); a rejected eager one is acked.
  auto reject = [&](detail::drop_counter counter, std::string reason) {
    drop(param, counter, std::move(reason));
    if (rendezvous)
      return UCS_ERR_REJECTED;
    send_ack(sender_of(param), credit_bytes);
    return UCS_OK;
  };
  if (auto bad = detail::check_data_frame(bytes_of(header, header_length), length,
                                          options_.token, decode_options_))
    return reject(bad->counter, std::move(bad->reason));
  auto* from = sender_of(param);
  if (!from)
    return reject(&data_plane_stats::dropped_unknown_peer, "the endpoint never said hello");

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

void data_plane::impl::on_receive_done(void* request, ucs_status_t status, std::size_t,
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
void data_plane::impl::deliver(std::unique_ptr<receive_op> op, bool zero_copy) {
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

// -- acks ---------------------------------------------------------------------

/// Owes `p` an ack for `bytes`. Acks are coalesced per peer (ack_coalescer):
/// one goes at once when max_messages or max_bytes are owed to `p`, the
/// others when flush_acks() runs (the thread goes idle, or the oldest owed
/// ack has waited max_delay), so a long burst (streaming put data) still
/// returns credits.
void data_plane::impl::send_ack(peer* p, std::size_t bytes) {
  if (!p || closing_now_)
    return;
  if (acks_.owe(*p, bytes))
    flush_ack(*p);
}

void data_plane::impl::flush_acks() {
  acks_.flush_all([this](peer& p) { flush_ack(p); });
}

void data_plane::impl::flush_ack(peer& p) {
  if (p.ack.messages == 0)
    return;
  auto bytes = std::exchange(p.ack.bytes, 0);
  auto messages = std::exchange(p.ack.messages, 0);
  auto* ep = p.reply_ep ? p.reply_ep : p.own_ep;
  if (!ep || closing_now_)
    return;
  send_control(ep, data_plane_wire::ack_am, detail::write_ack(p.remote_id, bytes, messages));
}

void data_plane::impl::drop(const ucp_am_recv_param_t* param, detail::drop_counter counter,
                            std::string reason) {
  {
    std::lock_guard guard(mutex_);
    ++(stats_.*counter);
  }
  log("dropped a message from peer {}: {}", describe(param), reason);
}

// -- receive buffers ----------------------------------------------------------

/// A buffer from receive_buffers_ whose tensor keeps this data plane alive
/// until its last view goes away.
std::shared_ptr<storage> data_plane::impl::lend_buffer(std::size_t bytes) {
  return detail::receive_buffer_pool::lend({shared_from_this(), &receive_buffers_}, bytes);
}

/// Gives UCX's persistent eager data back, on the transport thread while
/// it runs, directly once it has stopped (no other thread uses the worker
/// then; release_mutex_ serialises the deleters).
void data_plane::impl::release_data(void* data) {
  std::lock_guard guard(release_mutex_);
  if (thread_running_) {
    releases_.push_back(data);
    wake();
  } else {
    ucp_am_data_release(worker_, data);
  }
}

} // namespace troupe::actors
