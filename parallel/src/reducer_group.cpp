#include "troupe/parallel/reducer_group.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <thread>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "troupe/actors/tensor_router.hpp"
#include "troupe/job.hpp"

#include "reducer_member.hpp"
#include "same_host_workspace.hpp"

namespace troupe::parallel {

struct reducer_member::reducer_actor {
  caf::actor handle;
};

using namespace std::chrono_literals;

namespace {
/// message_algorithm's names, by value.
constexpr std::array<std::string_view, 3> algorithm_names = {"ring", "halving-doubling", "automatic"};
} // namespace

std::string_view name_of(message_algorithm algorithm) {
  return algorithm_names.at(static_cast<std::size_t>(algorithm));
}

expected<message_algorithm> message_algorithm_named(std::string_view name) {
  auto named = std::find(algorithm_names.begin(), algorithm_names.end(), name);
  if (named == algorithm_names.end())
    return make_error(errc::invalid_argument, "message algorithm '{}' is not one of {}", name,
                      fmt::join(algorithm_names, ", "));
  return static_cast<message_algorithm>(named - algorithm_names.begin());
}

struct reducer_member::state {
  std::mutex mutex;
  std::condition_variable arrived;
  std::map<reducer_member::key, tensor> mailbox;
  std::optional<std::string> failure; // sticky: a lost replica or a failed send
  std::shared_ptr<actors::tensor_router> router;

  void put(const actors::tensor_message& m) {
    {
      std::lock_guard lock(mutex);
      mailbox[{m.meta.context_id, static_cast<std::uint32_t>(m.meta.step), m.meta.micro_batch}] = m.value;
    }
    arrived.notify_all();
  }

  void fail(std::string why) {
    {
      std::lock_guard lock(mutex);
      if (!failure)
        failure = std::move(why);
    }
    arrived.notify_all();
  }
};

std::vector<std::string> reducer_places(const std::vector<std::string>& node_names) {
  std::vector<std::string> out;
  for (std::size_t k = 0; k < node_names.size(); ++k)
    out.push_back(fmt::format("{}/cpu/reducer{}", node_names[k], k));
  return out;
}

reducer_member::reducer_member(actors::node& node, reducer_group_options options, std::vector<actors::place> places)
    : node_(node), options_(std::move(options)), places_(std::move(places)), state_(std::make_shared<state>()),
      trace_name_(trace::intern(places_.at(options_.rank).to_string())) {}

std::string reducer_member::describe(std::uint32_t rank) const {
  return fmt::format("replica {} ({})", rank, places_.at(rank).to_string());
}

tensor reducer_member::chunk_buffer(std::uint32_t to, dtype type, std::int64_t count) {
  // The router's own threshold for copying heap tensors into the arena
  // (tensor_router_options::copy_into_arena_min_bytes): below it UCX sends
  // eagerly and a handoff's fixed cost dominates.
  constexpr std::size_t arena_min_bytes = std::size_t{64} << 10;
  if (places_.at(to).node != node_.name() && static_cast<std::size_t>(count) * size_of(type) >= arena_min_bytes)
    if (auto in_arena = state_->router->arena_tensor({count}, type))
      return std::move(*in_arena);
  return tensor::empty({count}, type);
}

tensor reducer_member::buffer(const dims& shape, dtype type) {
  if (workspace_ != nullptr)
    if (auto in_arena = state_->router->arena_tensor(shape, type)) // an error when the node has no arena
      return std::move(*in_arena);
  return tensor::empty(shape, type);
}

std::uint64_t reducer_member::next_id() noexcept { return (std::uint64_t{1} << 63) | ++next_id_; }

expected<reducer_group> reducer_group::join(troupe::job& job, reducer_group_options options) {
  if (options.places.empty()) {
    options.rank = job.rank();
    options.places = reducer_places(job.nodes());
  }
  auto member = reducer_member::join(job.node(), std::move(options));
  if (!member)
    return member.error();
  (*member)->stop_with(job);
  return reducer_group(std::move(*member));
}

expected<reducer_group> reducer_group::join(actors::node& node, reducer_group_options options) {
  auto member = reducer_member::join(node, std::move(options));
  if (!member)
    return member.error();
  return reducer_group(std::move(*member));
}

reducer_group::reducer_group(std::shared_ptr<reducer_member> member) : member_(std::move(member)) {}
reducer_group::~reducer_group() = default;
reducer_group::reducer_group(reducer_group&&) noexcept = default;
reducer_group& reducer_group::operator=(reducer_group&&) noexcept = default;
std::uint32_t reducer_group::rank() const noexcept { return member_->rank(); }
std::uint32_t reducer_group::size() const noexcept { return member_->size(); }
const reducer_group_options& reducer_group::options() const noexcept { return member_->options(); }
const actors::place& reducer_group::place_of(std::uint32_t rank) const { return member_->place_of(rank); }
std::string reducer_group::describe(std::uint32_t rank) const { return member_->describe(rank); }
bool reducer_group::shares_memory() const noexcept { return member_->workspace() != nullptr; }
tensor reducer_group::buffer(const dims& shape, dtype type) { return member_->buffer(shape, type); }
std::uint64_t reducer_group::next_id() noexcept { return member_->next_id(); }

void reducer_member::stop_with(troupe::job& job) {
  finish_hook_ = finish_hook(job, [this] { shutdown(); });
}

expected<std::shared_ptr<reducer_member>> reducer_member::join(actors::node& node, reducer_group_options options) {
  if (options.places.empty() || options.rank >= options.places.size())
    return make_error(errc::invalid_argument, "reducer_group: rank {} is outside the {} places", options.rank,
                      options.places.size());
  const bool from_node = !options.messages;
  if (from_node) {
    auto configured = message_algorithm_named(node.options().collectives);
    if (!configured)
      return make_error(errc::invalid_argument, "reducer_group: --troupe.collectives: {}",
                        configured.error().message());
    options.messages = *configured;
  }
  if (const auto n = options.places.size();
      options.messages == message_algorithm::halving_doubling && (n & (n - 1)) != 0)
    return make_error(errc::invalid_argument,
                      "reducer_group: halving_doubling needs a power-of-two number of members, not {} ({})", n,
                      from_node ? "from --troupe.collectives=halving-doubling; use ring or automatic" : "use the ring");
  if (options.chunk_bytes < 64)
    return make_error(errc::invalid_argument, "reducer_group: chunk_bytes {} is below 64", options.chunk_bytes);
  std::vector<actors::place> places;
  for (const auto& text : options.places) {
    auto p = actors::place::parse_named(text);
    if (!p)
      return make_error(errc::invalid_argument, "reducer_group: {}", p.error().message());
    places.push_back(*p);
  }
  const auto& mine = places[options.rank];
  if (mine.node != node.name())
    return make_error(errc::invalid_argument, "reducer_group: rank {}'s place {} is not on this node ({})",
                      options.rank, mine.to_string(), node.name());
  auto router = node.router();
  if (!router)
    return make_error(errc::invalid_argument, "reducer_group: the node has no tensor router");
  std::shared_ptr<reducer_member> group(new reducer_member(node, std::move(options), std::move(places)));
  group->state_->router = router;

  // The reducer actor only files arriving chunks; the collective that
  // waits for them runs on its caller's thread.
  auto st = group->state_;
  group->reducer_ = std::make_unique<reducer_actor>();
  group->reducer_->handle = node.system().spawn<caf::detached>([st](caf::event_based_actor* self) -> caf::behavior {
    // Stopped with its node (node::stop stops every registered actor): a
    // collective still waiting, say for a replica whose own pipeline lost a
    // stage and never reaches this reduction, ends now instead of at the
    // ring's timeout, and the node's stop, which waits for that thread,
    // with it.
    self->attach_functor([weak = std::weak_ptr<state>(st)] {
      if (auto s = weak.lock())
        s->fail("this rank's reducer stopped (its node is stopping)");
    });
    return {[st](const actors::tensor_message& m) { st->put(m); }};
  });
  // Attach before the registry learns the place, so that a neighbour that
  // resolves it can never send to a place this node does not know yet.
  // Chunks go straight into the mailbox from the delivering thread (a sink:
  // one thread hand-off fewer per chunk); the actor stays registered so
  // that members find the place and anything routed through the registry
  // still arrives.
  router->attach(mine.to_string(), group->reducer_->handle);
  std::weak_ptr<state> sink_state = group->state_;
  router->attach_sink(mine.to_string(), [sink_state](actors::tensor_message m) {
    if (auto s = sink_state.lock())
      s->put(m);
  });
  if (auto ok = node.register_actor(mine, group->reducer_->handle); !ok)
    return make_error(ok.error().code(), "reducer_group: registering {} failed: {}", mine.to_string(),
                      ok.error().message());

  std::weak_ptr<state> weak = group->state_;
  auto places_copy = group->places_;
  group->peer_lost_handler_ = node.on_peer_lost([weak, places_copy](const actors::peer_lost& lost) {
    auto s = weak.lock();
    if (!s)
      return;
    for (std::size_t k = 0; k < places_copy.size(); ++k)
      if (places_copy[k].node == lost.node) {
        s->fail(fmt::format("replica {} ({}) was lost: node {} went away ({})", k, places_copy[k].to_string(),
                            lost.node, lost.reason));
        return;
      }
  });

  // Wait until every member is registered (bounded).
  auto deadline = std::chrono::steady_clock::now() + group->options_.timeout;
  for (std::uint32_t k = 0; k < group->size(); ++k) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto found = node.await_actor(group->places_[k], std::max(left, std::chrono::milliseconds{1}));
    if (!found)
      return make_error(errc::io_error, "reducer_group: {} did not join within {} ms ({})", group->describe(k),
                        group->options_.timeout.count(), found.error().message());
  }
  if (group->size() > 1)
    if (auto ok = group->offer_same_host(); !ok)
      return ok.error();
  return group;
}

expected<void> reducer_member::offer_same_host() {
  // Collective id 0 is never a collective's (0 in the options means "take
  // next_id()"), so the offers cannot mix with a collective's chunks.
  constexpr std::uint64_t offer_id = 0;
  same_host_offer mine;
  mine.host_key = state_->router->host_key();
  mine.messages = options_.messages.value();
  std::unique_ptr<same_host_workspace> ws;
  if (options_.same_host == same_host_algorithm::shared_memory && !mine.host_key.empty()) {
    std::weak_ptr<state> weak = state_;
    // The node's arena: tensors allocated there (buffer()) are read in place.
    auto* arena = state_->router->arena();
    auto created = same_host_workspace::create({
        .rank = rank(),
        .size = size(),
        .pass_bytes = options_.same_host_pass_bytes,
        .timeout = options_.timeout,
        .failure = [weak]() -> std::optional<std::string> {
          auto s = weak.lock();
          if (!s)
            return std::string("the reducer group is gone");
          std::lock_guard lock(s->mutex);
          return s->failure;
        },
        .describe = [this](std::uint32_t k) { return describe(k); },
        .arena_name = arena != nullptr ? arena->name() : std::string(),
        .arena_base = arena != nullptr ? arena->base() : nullptr,
        .arena_bytes = arena != nullptr ? arena->capacity() : 0,
        .single_copy = options_.same_host_single_copy,
    });
    if (created) {
      ws = std::move(*created);
      mine.wants = true;
      mine.segment = ws->own();
    } else if (created.error().code() == errc::invalid_argument) {
      return make_error(errc::invalid_argument, "reducer_group: {}", created.error().message());
    }
    // Otherwise (no room in /dev/shm, ...) this rank declines and every
    // member keeps to the ring.
  }
  auto bytes = encode_offer(mine);
  for (std::uint32_t k = 0; k < size(); ++k) {
    if (k == rank())
      continue;
    auto t = tensor::empty({static_cast<std::int64_t>(bytes.size())}, dtype::uint8);
    std::memcpy(t.data<std::uint8_t>(), bytes.data(), bytes.size());
    if (auto ok = send_to(k, offer_id, 0, rank(), std::move(t)); !ok)
      return ok;
  }
  bool all = mine.wants;
  std::vector<same_host_offer> offers(size());
  for (std::uint32_t k = 0; k < size(); ++k) {
    if (k == rank())
      continue;
    auto got = receive(k, offer_id, 0, k);
    if (!got)
      return make_error(got.error().code(), "reducer_group: no same-host offer: {}", got.error().message());
    if (got->type() != dtype::uint8 || !got->is_contiguous())
      return make_error(errc::malformed_message, "reducer_group: the same-host offer of {} is not a byte tensor",
                        describe(k));
    auto offer =
        decode_offer(std::as_bytes(std::span(got->data<std::uint8_t>(), static_cast<std::size_t>(got->numel()))));
    if (!offer)
      return make_error(offer.error().code(), "reducer_group: from {}: {}", describe(k), offer.error().message());
    all = all && offer->wants && offer->host_key == mine.host_key;
    offers[k] = std::move(*offer);
  }
  // Checked once every offer is in: a member that left at the first
  // mismatch could leave before a slower one had sent its own offers, and
  // that one would wait for it until the timeout instead of saying why.
  for (std::uint32_t k = 0; k < size(); ++k)
    if (k != rank() && offers[k].messages != mine.messages) {
      return make_error(errc::invalid_argument,
                        "reducer_group: {} runs its collectives over messages by {}, this rank ({}) by {}; every "
                        "member must choose the same",
                        describe(k), name_of(offers[k].messages), describe(rank()), name_of(mine.messages));
    }
  if (!all)
    return {}; // some member is elsewhere or declined: the ring for everything
  // Every member saw the same offers, so every member is here now.
  for (std::uint32_t k = 0; k < size(); ++k)
    if (k != rank())
      if (auto ok = ws->map_peer(k, offers[k].segment); !ok)
        return make_error(ok.error().code(), "reducer_group: {}", ok.error().message());
  if (auto ok = ws->finish_setup(); !ok)
    return make_error(ok.error().code(), "reducer_group: {}", ok.error().message());
  workspace_ = std::move(ws);
  return {};
}

reducer_member::~reducer_member() {
  finish_hook_.forget();
  shutdown();
}

void reducer_member::shutdown() {
  if (shut_down_)
    return;
  shut_down_ = true;
  state_->fail("this rank has left the ring (its group was shut down)");
  workspace_.reset();
  if (peer_lost_handler_)
    node_.remove_peer_lost_handler(peer_lost_handler_);
  (void)node_.unregister_actor(places_[options_.rank]);
  if (reducer_ && reducer_->handle)
    caf::anon_send_exit(reducer_->handle, caf::exit_reason::user_shutdown);
  // A strong handle keeps a stopped detached actor's thread waiting, and
  // the actor system's shutdown with it (a group outliving its job).
  reducer_.reset();
}

expected<void> reducer_member::send_right(std::uint64_t id, std::uint32_t step, std::uint32_t chunk_index,
                                         tensor chunk) {
  return send_to((rank() + 1) % size(), id, step, chunk_index, std::move(chunk));
}

expected<void> reducer_member::send_to(std::uint32_t to, std::uint64_t id, std::uint32_t step,
                                      std::uint32_t chunk_index, tensor chunk) {
  actors::tensor_message m;
  m.meta.kind = message_kind::gradient_bucket;
  m.meta.context_id = id;
  m.meta.step = step;
  m.meta.micro_batch = chunk_index;
  m.value = std::move(chunk);
  std::weak_ptr<state> weak = state_;
  auto who = describe(to);
  auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  while (true) {
    {
      std::lock_guard lock(state_->mutex);
      if (state_->failure)
        return make_error(errc::io_error, "reducer{}: {}", rank(), *state_->failure);
    }
    auto sent = state_->router->send(places_[to], m, [weak, who](expected<void> r) {
      if (!r)
        if (auto s = weak.lock())
          s->fail(fmt::format("sending to {} failed: {}", who, r.error().message()));
    }, trace_name_);
    if (sent)
      return {};
    // Back-pressure: wait for completions, bounded.
    if (sent.error().code() == errc::size_limit_exceeded && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(100us);
      continue;
    }
    return make_error(sent.error().code(), "reducer{}: sending to {} failed: {}", rank(), who,
                      sent.error().message());
  }
}

expected<tensor> reducer_member::receive(std::uint32_t from, std::uint64_t id, std::uint32_t step,
                                        std::uint32_t chunk_index) {
  std::unique_lock lock(state_->mutex);
  key k{id, step, chunk_index};
  auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  while (true) {
    if (auto it = state_->mailbox.find(k); it != state_->mailbox.end()) {
      auto value = std::move(it->second);
      state_->mailbox.erase(it);
      return value;
    }
    if (state_->failure)
      return make_error(errc::io_error, "reducer{}: {}", rank(), *state_->failure);
    if (state_->arrived.wait_until(lock, deadline) == std::cv_status::timeout &&
        state_->mailbox.find(k) == state_->mailbox.end() && !state_->failure)
      return make_error(errc::io_error,
                        "reducer{}: nothing from {} for {} ms (collective {:#x}, step {}, chunk {})", rank(),
                        describe(from), options_.timeout.count(), id, step, chunk_index);
  }
}

void reducer_member::forget(std::uint64_t id) {
  std::lock_guard lock(state_->mutex);
  for (auto it = state_->mailbox.begin(); it != state_->mailbox.end();)
    it = std::get<0>(it->first) == id ? state_->mailbox.erase(it) : std::next(it);
}

} // namespace troupe::parallel
