#include "reply_endpoint.hpp"

#include <fmt/format.h>

#include "actor_places.hpp"
#include "ps_wire.hpp"
#include "troupe/actors/tensor_router.hpp"

namespace troupe::parallel::detail {

expected<std::shared_ptr<reply_endpoint>> reply_endpoint::open(actors::node& node, std::string place) {
  std::shared_ptr<reply_endpoint> endpoint(new reply_endpoint(node, std::move(place)));
  std::weak_ptr<reply_endpoint> weak = endpoint;
  auto handle = attach_place(node, endpoint->place_, [weak](const actors::tensor_message& m) {
    if (auto e = weak.lock())
      e->on_reply(m);
  });
  if (!handle)
    return handle.error();
  endpoint->handle_ = *handle;
  return endpoint;
}

reply_endpoint::~reply_endpoint() { close("the caller was shut down"); }

void reply_endpoint::fail_when_lost(std::function<std::optional<std::string>(const actors::peer_lost&)> why) {
  std::weak_ptr<reply_endpoint> weak = weak_from_this();
  peer_lost_handler_ = node_.on_peer_lost([weak, why](const actors::peer_lost& lost) {
    if (auto e = weak.lock())
      if (auto text = why(lost))
        e->fail(*text);
  });
}

void reply_endpoint::fail(std::string why) {
  {
    std::lock_guard lock(mutex_);
    if (!failure_)
      failure_ = std::move(why);
  }
  arrived_.notify_all();
}

std::optional<std::string> reply_endpoint::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

expected<void> reply_endpoint::expect(std::uint64_t request) {
  std::lock_guard lock(mutex_);
  if (failure_)
    return make_error(errc::io_error, "{}", *failure_);
  replies_[request];
  return {};
}

void reply_endpoint::forget(const std::vector<std::uint64_t>& requests) {
  std::lock_guard lock(mutex_);
  for (auto r : requests)
    replies_.erase(r);
}

expected<std::vector<tensor>> reply_endpoint::wait(const std::vector<std::uint64_t>& requests,
                                                   std::chrono::milliseconds timeout, const std::string& what) {
  std::unique_lock lock(mutex_);
  auto all_done = [&] {
    if (failure_)
      return true;
    for (auto r : requests)
      if (!replies_[r].done)
        return false;
    return true;
  };
  const bool answered = arrived_.wait_for(lock, timeout, all_done);
  std::optional<std::string> error;
  std::vector<tensor> values;
  for (auto r : requests) {
    auto& reply = replies_[r];
    if (!error && reply.done && reply.error)
      error = *reply.error;
    values.push_back(std::move(reply.value));
  }
  for (auto r : requests)
    replies_.erase(r);
  if (error)
    return make_error(errc::io_error, "{}", *error);
  if (failure_)
    return make_error(errc::io_error, "{}", *failure_);
  if (!answered)
    return make_error(errc::io_error, "no reply to {} within {} ms", what, timeout.count());
  return values;
}

void reply_endpoint::close(std::string why) {
  {
    std::lock_guard lock(mutex_);
    if (closed_)
      return;
    closed_ = true;
    if (!failure_)
      failure_ = std::move(why);
  }
  arrived_.notify_all();
  if (peer_lost_handler_)
    node_.remove_peer_lost_handler(peer_lost_handler_);
  detach_place(node_, place_, handle_);
}

void reply_endpoint::on_reply(const actors::tensor_message& m) {
  actors::tensor_receive_scope traced(trace_name_, m);
  {
    std::lock_guard lock(mutex_);
    auto it = replies_.find(m.meta.context_id);
    if (it == replies_.end())
      return; // a late reply to a request that already failed
    if (m.meta.kind == message_kind::control)
      it->second.error = ps_wire::decode_text(m.value);
    else
      it->second.value = m.value;
    it->second.done = true;
  }
  arrived_.notify_all();
}

} // namespace troupe::parallel::detail
