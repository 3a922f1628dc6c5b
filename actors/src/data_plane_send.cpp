// The data plane's send path (steps 1, 2 and 5 of "Flow control, step by
// step" in data_plane.cpp): send() and send_by_reference() encode a message
// and queue it for its peer from any thread; on the transport thread
// pump_all() hands what each peer's credits allow to UCX, and a completed
// or failed send releases its rendezvous slot (and, when it failed, its
// credits) and tells the caller. Releases of arena regions travel here too.
// Apart from data_plane.cpp so that a message's way out reads in one file.
#include <memory>
#include <utility>
#include <vector>

#include "data_plane_impl.hpp"
#include "troupe/serialization/encoded_message.hpp"

namespace troupe::actors {

expected<void> data_plane::impl::send(peer_id to, tensor_message message,
                                      completion_callback done) {
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

expected<void> data_plane::impl::send_by_reference(peer_id to, tensor_message message,
                                                   const arena_ref& region,
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
  auto frame = detail::write_arena_frame(region, encoded.header_bytes());
  if (!frame)
    return frame.error();
  op->frame = std::move(*frame);
  op->credit_bytes = op->frame.size();
  op->done = std::move(done);
  return enqueue(std::move(op));
}

void data_plane::impl::send_release(peer_id to, const arena_ref& region) {
  if (region.arena.empty() || region.arena.size() > data_plane_wire::max_arena_name_bytes)
    return;
  auto header = detail::write_release(options_.token, region);
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

expected<void> data_plane::impl::enqueue(std::unique_ptr<send_op> op) {
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
    // To another host, a rendezvous handshake queues behind the data already
    // on the connection (data_plane_options::network_eager_bytes).
    if (p->on_another_host && op->am_id == data_plane_wire::data_am &&
        op->encoded.payload().size() <= options_.network_eager_bytes) {
      op->rendezvous = false;
      op->eager = true;
    }
    if (p->sends.full()) {
      ++stats_.back_pressure_refusals;
      return make_error(errc::size_limit_exceeded,
                        "data plane: {} sends already queued to peer '{}' (back-pressure)",
                        p->sends.waiting(), p->name);
    }
    p->sends.push(std::move(op));
    sends_waiting_ = true;
  }
  wake();
  return {};
}

/// Sends the release messages other threads queued (send_release).
void data_plane::impl::send_releases() {
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
void data_plane::impl::pump_all() {
  std::vector<std::unique_ptr<send_op>> ready;
  {
    std::lock_guard guard(mutex_);
    sends_waiting_ = false;
    for (auto& p : peers_) {
      if (!p->ep())
        continue;
      while (auto op = p->sends.take_ready())
        ready.push_back(std::move(op));
    }
  }
  for (auto& op : ready)
    post_send(std::move(op));
}

void data_plane::impl::post_send(std::unique_ptr<send_op> op) {
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
  if (op->eager)
    param.flags |= UCP_AM_SEND_FLAG_EAGER;
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
void data_plane::impl::on_send_done(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  std::unique_ptr<send_op> op(static_cast<send_op*>(user_data));
  auto* self = op->owner;
  if (op->rendezvous)
    --self->rendezvous_sends_pending_;
  self->complete_send(std::move(op), status);
}

void data_plane::impl::complete_send(std::unique_ptr<send_op> op, ucs_status_t status) {
  expected<void> result;
  auto* p = find_locked(op->to);
  {
    std::lock_guard guard(mutex_);
    if (p)
      p->sends.sent(*op);
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
    if (p)
      p->sends.return_credits(op->credit_bytes);
    if (!(closing_now_ && status == UCS_ERR_CANCELED))
      log("send to peer '{}' failed: {}", p ? p->name : std::string("?"), status_text(status));
    result = make_error(errc::io_error, "data plane: send to peer '{}' failed: {}",
                        p ? p->name : std::string("?"), status_text(status));
    wake();
  }
  if (op->done)
    op->done(std::move(result));
}

} // namespace troupe::actors
