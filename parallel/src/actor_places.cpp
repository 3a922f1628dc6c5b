#include "actor_places.hpp"

#include <algorithm>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "troupe/actors/place.hpp"

namespace troupe::parallel::detail {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

std::string node_of(const std::string& place_text) {
  return place_text.substr(0, place_text.find('/'));
}

expected<caf::actor> attach_place(actors::node& node, const std::string& where,
                                  std::function<void(const actors::tensor_message&)> sink) {
  auto router = node.router();
  if (!router)
    return make_error(errc::invalid_argument, "parameter server: the node has no tensor router");
  auto parsed = actors::place::parse_named(where);
  if (!parsed)
    return make_error(errc::invalid_argument, "parameter server: {}", parsed.error().message());
  auto handle = node.system().spawn([sink](caf::event_based_actor*) -> caf::behavior {
    return {[sink](const actors::tensor_message& m) { sink(m); }};
  });
  router->attach(where, handle);
  router->attach_sink(where, [sink](actors::tensor_message m) { sink(m); });
  if (auto ok = node.register_actor(*parsed, handle); !ok) {
    caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
    return make_error(ok.error().code(), "parameter server: registering {} failed: {}", where, ok.error().message());
  }
  return handle;
}

void detach_place(actors::node& node, const std::string& where, caf::actor& handle) {
  if (auto router = node.router())
    router->detach(where);
  if (auto parsed = actors::place::parse_named(where))
    (void)node.unregister_actor(*parsed);
  if (handle)
    caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  handle = nullptr;
}

expected<void> await_places(actors::node& node, const std::vector<std::string>& places,
                            std::chrono::milliseconds timeout) {
  auto deadline = clock_type::now() + timeout;
  for (const auto& where : places) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    auto found = node.await_actor(*actors::place::parse_named(where), std::max(left, 1ms));
    if (!found)
      return make_error(errc::io_error, "parameter server: {} was not registered within {} ms ({})", where,
                        timeout.count(), found.error().message());
  }
  return {};
}

/// A tensor for another node: in this node's shared arena when it is large
/// enough that the router would copy it there anyway (a same-host receiver
/// then maps it: no copy at all), on the heap otherwise or when the arena
/// is full or absent.
tensor outgoing_tensor(actors::tensor_router& router, const dims& shape, dtype type) {
  constexpr std::size_t arena_min_bytes = std::size_t{64} << 10; // tensor_router_options' default
  if (static_cast<std::size_t>(numel_of(shape)) * size_of(type) >= arena_min_bytes)
    if (auto in_arena = router.arena_tensor(shape, type))
      return std::move(*in_arena);
  return tensor::empty(shape, type);
}

actors::tensor_message make_message(message_kind kind, std::uint64_t step, std::uint32_t micro_batch,
                                    std::uint64_t context, tensor value) {
  actors::tensor_message m;
  m.meta.kind = kind;
  m.meta.step = step;
  m.meta.micro_batch = micro_batch;
  m.meta.context_id = context;
  m.value = std::move(value);
  return m;
}

} // namespace troupe::parallel::detail
