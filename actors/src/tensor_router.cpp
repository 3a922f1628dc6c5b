#include "troupe/actors/tensor_router.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "blocking_worker.hpp"
#include "troupe/actors/error_category.hpp"
#include "troupe/actors/message_types.hpp"
#include "troupe/tensor/streaming_copy.hpp"

namespace troupe::actors {

using namespace std::chrono_literals;

namespace {

constexpr std::string_view host_line_prefix = "troupe-host ";

/// Processes with the same key can map each other's arenas: the same kernel
/// boot (boot_id) and the same /dev/shm (device and inode, so a separate
/// mount namespace with its own /dev/shm differs).
std::string this_host_key() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  struct stat info {};
  if (boot.empty() || ::stat("/dev/shm", &info) != 0)
    return {};
  return fmt::format("{}:{:x}:{:x}", boot, static_cast<unsigned long long>(info.st_dev),
                     static_cast<unsigned long long>(info.st_ino));
}

} // namespace

struct tensor_router::impl {
  struct queued {
    tensor_message message;
    completion_callback done;
    /// A device tensor staged to the host (start_copy_to_host): blocks until
    /// message.value holds its bytes. Run by `stager`, never with `mutex`
    /// held; empty otherwise.
    std::function<void()> staged;
  };

  caf::actor_system* system = nullptr;
  tensor_router_options options;
  std::unique_ptr<data_plane> plane; // null when encrypted
  caf::actor actor;

  mutable std::mutex mutex;
  bool stopped = false;
  std::map<std::string, caf::actor> local;         // place -> actor in this process
  std::map<std::string, tensor_router::tensor_sink> sinks; // place -> function (attach_sink)
  std::set<std::pair<std::string, device>> landing_warned; // (place, device) whose failed landing was said
  std::map<std::string, peer_id> connected;        // node -> data-plane peer
  std::map<std::string, caf::actor> agents;        // node -> its agent (TLS)
  std::map<std::string, std::deque<queued>> waiting; // node -> sends not yet handed on
  std::set<std::string> handing_on;                 // nodes whose sends the router's actor is handing on
  std::map<std::string, std::deque<queued>> staged_ready; // node -> sends on the host now, for the actor to hand on
  std::map<std::string, std::size_t> in_flight;    // node -> TLS sends awaiting the peer's ok
  std::map<std::string, std::string> lost;         // node -> why
  std::map<std::string, trace::name_id> trace_names;
  std::set<std::string> same_host;                 // connected nodes on this host
  tensor_router_stats stats;

  // Same-host tensors by reference (null without an arena).
  std::unique_ptr<shared_arena> arena;
  std::unique_ptr<arena_mapper> mapper;
  arena_loans loans;
  // Arena name -> the peer that handed it out. Its own mutex: the release
  // function runs wherever a received tensor's last view goes, including
  // inside `mutex` (a queued message dropped while draining).
  std::mutex owners_mutex;
  std::map<std::string, peer_id> arena_owners;
  std::atomic<std::size_t> copy_min{SIZE_MAX};
  std::atomic<std::uint64_t> arena_sends{0}, arena_copies{0}, arena_fallbacks{0}, arena_receives{0},
      arena_refused{0};

  // Waits for device tensors' copies to the host (hand_on). Declared after
  // what its jobs use, so destroyed before it: it finishes its jobs first.
  blocking_worker stager;

  template <class... Ts> void log(fmt::format_string<Ts...> format, Ts&&... args) {
    fmt::print(stderr, "troupe router [{}]: {}\n", options.node_name,
               fmt::format(format, std::forward<Ts>(args)...));
  }

  /// A send to a connected node: by reference when the node is on this host
  /// and the tensor lies in (or is worth copying into) the arena, through
  /// UCX otherwise. May run with `mutex` held: touches only the arena, the
  /// loans and atomics.
  expected<void> send_connected(const std::string& node, peer_id id, bool on_this_host,
                                tensor_message message, completion_callback done) {
    if (on_this_host && arena && message.value.defined() &&
        message.value.where().kind == device_kind::cpu && message.value.is_contiguous()) {
      auto value = message.value;
      bool by_reference = arena->contains(value);
      if (!by_reference && value.nbytes() > 0 && value.nbytes() >= copy_min.load(std::memory_order_relaxed)) {
        if (auto copy = arena->allocate(value.shape(), value.type())) {
          // Large copies stream past this core's cache: the reader is the other process.
          streaming_copy(copy->raw_data(), value.raw_data(), value.nbytes());
          value = std::move(*copy);
          by_reference = true;
          ++arena_copies;
        } else {
          ++arena_fallbacks; // no room: UCX instead, never wait for a release
        }
      }
      if (by_reference) {
        if (auto region = arena->share_region(value)) {
          loans.lend(node, *region);
          message.value = std::move(value);
          auto on_done = [this, node, region = *region, done = std::move(done)](expected<void> result) {
            if (!result) // never reached the node: nobody will release it
              end_loan(node, region);
            if (done)
              done(std::move(result));
          };
          auto ok = plane->send_by_reference(id, std::move(message), *region, std::move(on_done));
          if (!ok)
            end_loan(node, *region);
          else
            ++arena_sends;
          return ok;
        }
        // Not the start of an arena region (a view into one): a copy through UCX.
      }
    }
    return plane->send(id, std::move(message), std::move(done));
  }

  void end_loan(const std::string& node, const arena_ref& region) {
    if (loans.give_back(node, region))
      (void)arena->release(region);
  }

  /// Moves a delivered tensor onto the device its sender's map named
  /// (meta.landing). A device this process cannot use, or a failed copy,
  /// leaves it where it is (the host): delivered, with the reason on stderr.
  void land(tensor_message& message) {
    const auto where = *message.meta.landing;
    std::string failure;
    try { // "storage::allocate: device cuda:3 is not available: ...", out of memory, ...
      message.value = message.value.to(where);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    std::lock_guard guard(mutex);
    if (failure.empty()) {
      ++stats.landings;
      return;
    }
    // Said once per place and device: a misconfigured map would otherwise
    // print a line per message.
    ++stats.landing_failures;
    if (!landing_warned.emplace(message.meta.destination, where).second)
      return;
    fmt::print(stderr,
               "troupe router [{}]: a tensor for {} was to land on {} by its sender's device map, but "
               "moving it failed ({}); delivered on the host\n",
               options.node_name, message.meta.destination, where, failure);
  }

  /// A handoff from a same-host node (data plane thread): map, deliver; a
  /// region that cannot be opened is released at once so its owner can
  /// reuse it (the owner ignores it if it never lent it).
  void on_arena(tensor_router& self, peer_id from, arena_handoff&& handoff) {
    auto opened = mapper->open(handoff);
    if (!opened) {
      ++arena_refused;
      log("dropped a tensor handed over by node {}: {}", plane->peer_name(from), opened.error().to_string());
      plane->send_release(from, handoff.region);
      return;
    }
    {
      std::lock_guard guard(owners_mutex);
      arena_owners[handoff.region.arena] = from;
    }
    ++arena_receives;
    opened->meta.token = 0; // the job's secret stays in the data plane
    self.deliver(std::move(*opened));
  }

  /// A release from `from` (data plane thread): only for a region lent to it.
  void on_release(peer_id from, const arena_ref& region) {
    auto node = plane->peer_name(from);
    if (auto ok = loans.give_back(node, region); !ok) {
      ++arena_refused;
      log("refused a release: {}", ok.error().message());
      return;
    }
    if (auto ok = arena->release(region); !ok)
      log("release from node {}: {}", node, ok.error().message());
  }
  // Owned by the router's actor thread.
  std::set<std::string> resolving;
  std::map<std::string, caf::timestamp> resolve_deadline;

  trace::name_id trace_name(const std::string& text) {
    auto [it, fresh] = trace_names.try_emplace(text);
    if (fresh)
      it->second = trace::intern(text);
    return it->second;
  }

  static void fail(std::deque<queued>& sends, const troupe::error& why) {
    for (auto& q : sends)
      if (q.done)
        q.done(why);
  }

  // The registry has not got the node's address yet (it is still joining),
  // or the node is unknown: retry every 50 ms until the request timeout.
  void retry_or_fail(caf::event_based_actor* self, const std::string& node, const std::string& why) {
    resolving.erase(node);
    auto now = caf::make_timestamp();
    auto [it, fresh] = resolve_deadline.try_emplace(node, now + options.request_timeout);
    if (now < it->second) {
      // Anonymous: a reminder with this actor as its sender would be a
      // strong reference to itself (see parallel/src/stage.cpp).
      caf::delayed_anon_send(caf::actor_cast<caf::actor>(self), 50ms, route_atom_v, node);
      return;
    }
    resolve_deadline.erase(it);
    std::deque<queued> failed;
    {
      std::lock_guard guard(mutex);
      failed.swap(waiting[node]);
    }
    fail(failed, make_error(errc::io_error, "tensor to node {}: cannot reach it: {}", node, why));
  }

  // Runs on the router's actor (detached: connect() may block it briefly).
  void route(caf::event_based_actor* self, const std::string& node) {
    std::deque<queued> sends;
    {
      std::lock_guard guard(mutex);
      if (auto staged = staged_ready.find(node); staged != staged_ready.end()) {
        sends.swap(staged->second); // copies on the host; the node is still being handed on
        staged_ready.erase(staged);
      } else {
        if (stopped || lost.count(node) || waiting[node].empty() || handing_on.count(node))
          return;
        const bool ready = options.without_data_plane ? agents.count(node) != 0 : connected.count(node) != 0;
        if (ready)
          sends = take_waiting_locked(node);
      }
    }
    if (!sends.empty()) {
      hand_on(self, node, std::move(sends));
      return;
    }
    if (!resolving.insert(node).second)
      return;
    if (options.without_data_plane) {
      self->request(options.registry, options.request_timeout, lookup_node_atom_v, node)
        .then(
          [this, self, node](const caf::actor& agent) {
            resolving.erase(node);
            resolve_deadline.erase(node);
            {
              std::lock_guard guard(mutex);
              if (lost.count(node))
                return;
              agents[node] = agent;
            }
            route(self, node);
          },
          [this, self, node](caf::error& err) { retry_or_fail(self, node, system->render(err)); });
      return;
    }
    self->request(options.registry, options.request_timeout, data_address_atom_v, node)
      .then(
        [this, self, node](const std::string& published) {
          resolving.erase(node);
          resolve_deadline.erase(node);
          // "troupe-host <key>\n" then the UCX worker address.
          std::string_view address(published), host;
          if (address.starts_with(host_line_prefix)) {
            auto end = address.find('\n');
            if (end != std::string_view::npos) {
              host = address.substr(host_line_prefix.size(), end - host_line_prefix.size());
              address.remove_prefix(end + 1);
            }
          }
          // Each node publishes its host key when it has an arena; without
          // both keys the peer counts as on this host (rendezvous as before).
          const bool on_another_host = !host.empty() && !options.host_key.empty() && host != options.host_key;
          auto id = plane->connect(node, std::as_bytes(std::span(address.data(), address.size())), on_another_host);
          if (!id) {
            std::deque<queued> failed;
            {
              std::lock_guard guard(mutex);
              failed.swap(waiting[node]);
            }
            fail(failed, make_error(errc::io_error, "tensor to node {}: {}", node, id.error().message()));
            return;
          }
          // Connected, and what waits taken to be handed on, in one critical
          // section: a send() that finds the node connected goes straight
          // to the data plane once nothing waits, and must not overtake
          // what waits here from before.
          std::deque<queued> sends;
          {
            std::lock_guard guard(mutex);
            if (lost.count(node))
              return;
            connected[node] = *id;
            if (arena && !host.empty() && host == options.host_key)
              same_host.insert(node);
            if (!stopped && !waiting[node].empty())
              sends = take_waiting_locked(node);
          }
          if (!sends.empty())
            hand_on(self, node, std::move(sends));
        },
        [this, self, node](caf::error& err) { retry_or_fail(self, node, system->render(err)); });
  }

  using refusals = std::vector<std::pair<completion_callback, troupe::error>>;

  // Takes what waits for ready `node` to hand it on (hand_on); until that
  // is done, send() queues behind it rather than going to the node
  // directly, so nothing overtakes it. Called with the mutex held.
  std::deque<queued> take_waiting_locked(const std::string& node) {
    std::deque<queued> sends;
    sends.swap(waiting[node]);
    handing_on.insert(node);
    return sends;
  }

  // Why sends to `node` can no longer go (this node stopped, or that one
  // was lost); empty while they can. Called with the mutex held.
  std::string closed_locked(const std::string& node) {
    if (stopped)
      return fmt::format("node {} stopped first", options.node_name);
    if (auto it = lost.find(node); it != lost.end())
      return fmt::format("node {} was lost: {}", node, it->second);
    return {};
  }

  // Hands `sends` (taken by take_waiting_locked) on in order, then what
  // was queued meanwhile, until nothing waits. Device tensors among them
  // are first waited for on the stager's thread (stage_then_hand_on): the
  // senders did not wait (a GPU stage goes on queueing its next
  // micro-batch), and neither does the router's actor, which goes on
  // routing other nodes' sends.
  void hand_on(caf::event_based_actor* self, const std::string& node, std::deque<queued> sends) {
    while (true) {
      if (std::any_of(sends.begin(), sends.end(), [](const queued& q) { return static_cast<bool>(q.staged); })) {
        stage_then_hand_on(node, std::move(sends));
        return;
      }
      refusals refused;
      std::deque<queued> failed;
      bool finished = false;
      std::string why;
      {
        std::lock_guard guard(mutex);
        if (why = closed_locked(node); !why.empty()) {
          failed.swap(sends);
          handing_on.erase(node);
        } else {
          for (auto& r : send_locked(self, node, std::move(sends)))
            refused.push_back(std::move(r));
          sends.clear();
          if (waiting[node].empty()) {
            handing_on.erase(node);
            finished = true;
          } else {
            sends.swap(waiting[node]);
          }
        }
      }
      for (auto& [done, reason] : refused)
        done(reason);
      if (!failed.empty()) {
        fail(failed, make_error(errc::io_error, "tensor to node {}: {}", node, why));
        return;
      }
      if (finished)
        return;
    }
  }

  // On the stager's thread: waits for the copies of `sends` to reach the
  // host, then gives them back to the router's actor (route) to hand on;
  // the node stays in `handing_on`, so nothing overtakes them. A copy
  // that failed fails its send alone.
  void stage_then_hand_on(const std::string& node, std::deque<queued> sends) {
    auto batch = std::make_shared<std::deque<queued>>(std::move(sends));
    stager.post([this, node, batch] {
      refusals refused;
      std::deque<queued> ready;
      for (auto& q : *batch) {
        if (q.staged) {
          try {
            q.staged();
          } catch (const std::exception& e) {
            if (q.done)
              refused.emplace_back(std::move(q.done),
                                   make_error(errc::io_error, "tensor to {} on node {}: staging to the host failed: {}",
                                              q.message.meta.destination, node, e.what()));
            continue;
          }
          q.staged = nullptr;
        }
        ready.push_back(std::move(q));
      }
      batch->clear();
      std::deque<queued> failed;
      std::string why;
      caf::actor router_actor;
      {
        std::lock_guard guard(mutex);
        if (why = closed_locked(node); !why.empty()) {
          failed.swap(ready);
          handing_on.erase(node);
        } else if (!ready.empty()) {
          auto& slot = staged_ready[node];
          std::move(ready.begin(), ready.end(), std::back_inserter(slot));
          router_actor = actor;
        } else {
          router_actor = actor; // every copy failed: what waits behind still goes
          handing_on.erase(node);
        }
      }
      for (auto& [done, reason] : refused)
        done(reason);
      if (!failed.empty())
        fail(failed, make_error(errc::io_error, "tensor to node {}: {}", node, why));
      else if (router_actor)
        caf::anon_send(router_actor, route_atom_v, node);
    });
  }

  // Sends `sends` to ready `node` in order. Called with the mutex held;
  // returns the refused sends, whose completions the caller runs after
  // releasing it.
  refusals send_locked(caf::event_based_actor* self, const std::string& node, std::deque<queued> sends) {
    refusals refused;
    if (!options.without_data_plane) {
      auto id = connected[node];
      bool on_this_host = same_host.count(node) != 0;
      for (auto& q : sends) {
        auto done = q.done;
        if (auto ok = send_connected(node, id, on_this_host, std::move(q.message), std::move(q.done)); !ok) {
          ++stats.refused;
          if (done)
            refused.emplace_back(std::move(done),
                                 troupe::error(ok.error().code(), fmt::format("tensor to node {}: {}", node,
                                                                              ok.error().message())));
        } else {
          ++stats.data_plane_sends;
        }
      }
      return refused;
    }
    auto agent = agents[node];
    in_flight[node] += sends.size();
    stats.control_plane_sends += sends.size();
    for (auto& q : sends) {
      auto done = std::move(q.done);
      self->request(agent, options.request_timeout, deliver_atom_v, std::move(q.message))
        .then(
          [this, node, done](caf::ok_atom) {
            {
              std::lock_guard guard(mutex);
              --in_flight[node];
            }
            if (done)
              done({});
          },
          [this, node, done](caf::error& err) {
            {
              std::lock_guard guard(mutex);
              --in_flight[node];
            }
            if (done)
              done(make_error(errc::io_error, "tensor to node {} over TLS failed: {}", node, system->render(err)));
          });
    }
    return refused;
  }
};

namespace {

caf::behavior router_actor(caf::event_based_actor* self, tensor_router::impl* st) {
  return {
    [self, st](route_atom, const std::string& node) { st->route(self, node); },
    // A tensor for a place this node has not seen registered: ask the registry.
    [self, st](deliver_atom, tensor_message& message) {
      auto destination = message.meta.destination;
      self->request(st->options.registry, st->options.request_timeout, lookup_name_atom_v, destination)
        .then(
          [st, message](const caf::actor& found) mutable {
            {
              std::lock_guard guard(st->mutex);
              ++st->stats.remote_deliveries;
              if (found.node() == st->system->node())
                st->local[message.meta.destination] = found;
            }
            caf::anon_send(found, std::move(message));
          },
          [st, destination](caf::error&) {
            {
              std::lock_guard guard(st->mutex);
              ++st->stats.undeliverable;
            }
            fmt::print(stderr, "troupe router [{}]: dropped a tensor for {}: no actor is registered there\n",
                       st->options.node_name, destination);
          });
    },
  };
}

} // namespace

trace::name_id trace_kind(message_kind kind) {
  static const auto ids = [] {
    std::array<trace::name_id, message_kind_count> out{};
    for (int i = 0; i < message_kind_count; ++i)
      out[static_cast<std::size_t>(i)] = trace::intern(name_of(static_cast<message_kind>(i)));
    return out;
  }();
  auto i = static_cast<std::size_t>(kind);
  return i < ids.size() ? ids[i] : trace::name_id{};
}

tensor_receive_scope::tensor_receive_scope(trace::name_id actor, const tensor_message& m) noexcept
    : actor_(actor) {
  if (!trace::enabled())
    return;
  kind_ = trace_kind(m.meta.kind);
  trace::message_info info(kind_, {}, m.value.defined() ? m.value.nbytes() : 0, m.flow_id,
                           static_cast<std::uint32_t>(m.meta.step), m.meta.micro_batch);
  trace::message_received(actor, info);
  trace::handler_start(actor, info);
}

tensor_receive_scope::~tensor_receive_scope() {
  if (kind_.value != 0)
    trace::handler_end(actor_, kind_);
}

tensor_router::tensor_router(std::unique_ptr<impl> state) : impl_(std::move(state)) {}

tensor_router::~tensor_router() { stop(); }

expected<std::shared_ptr<tensor_router>> tensor_router::start(caf::actor_system& system,
                                                              tensor_router_options options) {
  auto st = std::make_unique<impl>();
  st->system = &system;
  st->options = std::move(options);
  std::shared_ptr<tensor_router> router(new tensor_router(std::move(st)));
  auto* raw = router->impl_.get();
  if (!raw->options.without_data_plane) {
    auto dp = raw->options.data_plane;
    dp.node_name = raw->options.node_name;
    dp.max_queued_sends = raw->options.max_queued_sends;
    // Runs on the transport thread; deliver() only looks up and anon_sends.
    std::weak_ptr<tensor_router> weak = router;
    dp.on_receive = [weak](peer_id, tensor_message&& message) {
      if (auto r = weak.lock())
        r->deliver(std::move(message));
    };
    if (raw->options.arena_bytes > 0) {
      if (raw->options.host_key.empty())
        raw->options.host_key = this_host_key();
      // What crashed processes left behind goes first (their touched pages
      // stay in memory as long as the name does).
      (void)shared_arena::remove_left_by_gone_processes();
      // Unique per process: two jobs (or tests) on one host may use the same node names.
      auto arena = shared_arena::create(
          shared_arena::name_for(fmt::format("{:x}-{}", raw->options.data_plane.token & 0xffffffu, ::getpid()),
                                 raw->options.node_name),
          raw->options.arena_bytes);
      if (!arena)
        return troupe::error(arena.error().code(), fmt::format("node {}: shared arena: {}",
                                                               raw->options.node_name, arena.error().message()));
      raw->arena = std::move(*arena);
      raw->copy_min = raw->options.copy_into_arena_min_bytes;
      // Runs in whatever thread drops the last view of a received tensor.
      raw->mapper = std::make_unique<arena_mapper>([weak](const arena_ref& region) {
        auto r = weak.lock();
        if (!r || !r->impl_->plane)
          return; // this node stopped: its peers take their loans back when it is lost
        peer_id owner = 0;
        {
          std::lock_guard guard(r->impl_->owners_mutex);
          if (auto it = r->impl_->arena_owners.find(region.arena); it != r->impl_->arena_owners.end())
            owner = it->second;
        }
        if (owner != 0)
          r->impl_->plane->send_release(owner, region);
      });
      dp.on_arena = [weak](peer_id from, arena_handoff&& handoff) {
        if (auto r = weak.lock())
          r->impl_->on_arena(*r, from, std::move(handoff));
      };
      dp.on_release = [weak](peer_id from, const arena_ref& region) {
        if (auto r = weak.lock())
          r->impl_->on_release(from, region);
      };
    }
    auto plane = data_plane::start(std::move(dp));
    if (!plane)
      return troupe::error(plane.error().code(),
                           fmt::format("node {}: data plane: {}", raw->options.node_name, plane.error().message()));
    raw->plane = std::move(*plane);
  }
  // Detached: it may block briefly in data_plane::connect.
  raw->actor = system.spawn<caf::detached>(router_actor, raw);
  return router;
}

expected<void> tensor_router::send(const place& to, tensor_message message, completion_callback done,
                                   trace::name_id sender) {
  auto& st = *impl_;
  if (to.name.empty())
    return make_error(errc::invalid_argument, "tensor to {}: the place names no actor", to.to_string());
  message.meta.destination = to.to_string();
  if (message.flow_id == 0)
    message.flow_id = trace::next_flow_id();
  // Both planes carry host memory: a device tensor leaving the process is
  // staged through the host. The copy is started here, after the kernels
  // that write the tensor, and waited for on the router's staging thread,
  // so the sender (a GPU stage) goes on queueing work meanwhile. The device map
  // for the destination says where it lands there.
  std::function<void()> staged;
  if (to.node != st.options.node_name && message.value.defined()) {
    if (auto map = st.options.device_maps.find(to.node); map != st.options.device_maps.end())
      message.meta.landing = map->second.find(message.value.where());
    if (message.value.where().kind != device_kind::cpu) {
      auto copy = start_copy_to_host(message.value);
      message.value = std::move(copy.host);
      staged = std::move(copy.wait);
    }
  }
  std::unique_lock guard(st.mutex);
  if (trace::enabled()) {
    trace::message_sent(sender, trace::message_info(trace_kind(message.meta.kind),
                                                    st.trace_name(message.meta.destination),
                                                    message.value.defined() ? message.value.nbytes() : 0,
                                                    message.flow_id, static_cast<std::uint32_t>(message.meta.step),
                                                    message.meta.micro_batch));
  }
  if (st.stopped) {
    ++st.stats.refused;
    return make_error(errc::io_error, "tensor to {}: node {} has stopped", message.meta.destination,
                      st.options.node_name);
  }
  if (to.node == st.options.node_name) {
    // In process: a plain CAF message; the handler shares the storage.
    ++st.stats.local_sends;
    if (auto sink = st.sinks.find(message.meta.destination); sink != st.sinks.end()) {
      auto call = sink->second; // a copy: detach may run concurrently
      guard.unlock();
      call(std::move(message));
      if (done)
        done({});
      return {};
    }
    auto it = st.local.find(message.meta.destination);
    auto target = it != st.local.end() ? it->second : caf::actor{};
    auto router_actor = st.actor;
    guard.unlock();
    if (target)
      caf::anon_send(target, std::move(message));
    else
      caf::anon_send(router_actor, deliver_atom_v, std::move(message)); // ask the registry
    if (done)
      done({});
    return {};
  }
  if (auto it = st.lost.find(to.node); it != st.lost.end()) {
    ++st.stats.refused;
    return make_error(errc::io_error, "tensor to {}: node {} was lost: {}", message.meta.destination, to.node,
                      it->second);
  }
  // Straight to a connected node, unless a send waits for the router's
  // actor (it must not be overtaken) or this one does.
  if (!st.options.without_data_plane && !staged && st.waiting[to.node].empty() && !st.handing_on.count(to.node)) {
    if (auto it = st.connected.find(to.node); it != st.connected.end()) {
      auto id = it->second;
      bool on_this_host = st.same_host.count(to.node) != 0;
      guard.unlock();
      auto destination = message.meta.destination;
      auto ok = st.send_connected(to.node, id, on_this_host, std::move(message), std::move(done));
      guard.lock();
      if (!ok) {
        ++st.stats.refused;
        return troupe::error(ok.error().code(), fmt::format("tensor to {} on node {}: {}", destination, to.node,
                                                            ok.error().message()));
      }
      ++st.stats.data_plane_sends;
      return {};
    }
  }
  auto& queue = st.waiting[to.node];
  // Bounded, except behind a staged send to a node the data plane is
  // connected to: there they wait only for the device.
  const bool bounded = st.options.without_data_plane || st.connected.count(to.node) == 0;
  if (bounded && queue.size() + st.in_flight[to.node] >= st.options.max_queued_sends) {
    ++st.stats.refused;
    return make_error(errc::size_limit_exceeded,
                      "tensor to {}: {} sends already waiting for node {} (back-pressure; retry after a completion)",
                      message.meta.destination, queue.size() + st.in_flight[to.node], to.node);
  }
  queue.push_back({std::move(message), std::move(done), std::move(staged)});
  auto router_actor = st.actor;
  guard.unlock();
  caf::anon_send(router_actor, route_atom_v, to.node);
  return {};
}

void tensor_router::attach(const std::string& where, caf::actor handle) {
  std::lock_guard guard(impl_->mutex);
  impl_->local[where] = std::move(handle);
}

void tensor_router::detach(const std::string& where) {
  std::lock_guard guard(impl_->mutex);
  impl_->local.erase(where);
  impl_->sinks.erase(where);
}

void tensor_router::attach_sink(const std::string& where, tensor_sink sink) {
  std::lock_guard guard(impl_->mutex);
  impl_->sinks[where] = std::move(sink);
}

void tensor_router::deliver(tensor_message message) {
  auto& st = *impl_;
  caf::actor target, router_actor;
  tensor_sink sink;
  {
    std::lock_guard guard(st.mutex);
    router_actor = st.actor;
    if (auto it = st.sinks.find(message.meta.destination); it != st.sinks.end()) {
      sink = it->second;
      ++st.stats.remote_deliveries;
    } else if (auto it = st.local.find(message.meta.destination); it != st.local.end()) {
      target = it->second;
      ++st.stats.remote_deliveries;
    }
  }
  if (sink) { // troupe's own endpoints (reducers, parameter servers) work on host memory
    sink(std::move(message));
    return;
  }
  if (message.meta.landing && message.value.defined() && message.value.where() != *message.meta.landing)
    impl_->land(message);
  if (target)
    caf::anon_send(target, std::move(message));
  else if (router_actor)
    caf::anon_send(router_actor, deliver_atom_v, std::move(message));
}

void tensor_router::on_peer_lost(const peer_lost& event) {
  auto& st = *impl_;
  std::deque<impl::queued> failed;
  {
    std::lock_guard guard(st.mutex);
    st.lost[event.node] = event.reason.empty() ? "connection lost" : event.reason;
    st.connected.erase(event.node);
    st.same_host.erase(event.node);
    st.agents.erase(event.node);
    failed.swap(st.waiting[event.node]);
  }
  // What the lost node held of our arena: nobody will release it now.
  if (st.arena)
    for (auto& region : st.loans.take_all(event.node))
      (void)st.arena->release(region);
  // Fails its queued data-plane sends and force-closes the endpoint (UCX's
  // error mode NONE would not notice by itself, data_plane.cpp).
  if (st.plane)
    if (auto id = st.plane->find_peer(event.node))
      st.plane->disconnect(*id);
  impl::fail(failed, make_error(errc::io_error, "tensor to node {}: node {} was lost: {}", event.node, event.node,
                                event.reason));
}

std::string tensor_router::host_key() const { return impl_->arena ? impl_->options.host_key : std::string(); }

std::string tensor_router::data_plane_address() const {
  if (!impl_->plane)
    return {};
  auto bytes = impl_->plane->address();
  auto out = fmt::format("{}{}\n", host_line_prefix, impl_->arena ? impl_->options.host_key : std::string());
  out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return out;
}

expected<tensor> tensor_router::arena_tensor(const dims& shape, dtype type) {
  if (!impl_->arena)
    return make_error(errc::invalid_argument, "node {} has no shared arena (TLS on, or arena_bytes = 0)",
                      impl_->options.node_name);
  return impl_->arena->allocate(shape, type);
}

shared_arena* tensor_router::arena() { return impl_->arena.get(); }

void tensor_router::set_copy_into_arena_min_bytes(std::size_t bytes) { impl_->copy_min = bytes; }

std::size_t tensor_router::arena_loans_outstanding() const { return impl_->loans.outstanding(); }

data_plane* tensor_router::plane() { return impl_->plane.get(); }

tensor_router_stats tensor_router::stats() const {
  std::lock_guard guard(impl_->mutex);
  auto out = impl_->stats;
  out.arena_sends = impl_->arena_sends;
  out.arena_copies = impl_->arena_copies;
  out.arena_fallbacks = impl_->arena_fallbacks;
  out.arena_receives = impl_->arena_receives;
  out.arena_refused = impl_->arena_refused;
  return out;
}

caf::actor tensor_router::actor() const {
  std::lock_guard guard(impl_->mutex);
  return impl_->actor;
}

void tensor_router::stop() {
  auto& st = *impl_;
  std::map<std::string, std::deque<impl::queued>> failed;
  caf::actor router_actor;
  {
    std::lock_guard guard(st.mutex);
    if (st.stopped)
      return;
    st.stopped = true;
    failed.swap(st.waiting);
    for (auto& [node, sends] : st.staged_ready)
      std::move(sends.begin(), sends.end(), std::back_inserter(failed[node]));
    st.staged_ready.clear();
    st.local.clear();
    st.agents.clear();
    // Our handle would keep the (detached) actor alive and the actor
    // system's shutdown waiting for it.
    router_actor = std::move(st.actor);
  }
  for (auto& [node, sends] : failed)
    impl::fail(sends, make_error(errc::io_error, "tensor to node {}: node {} stopped first", node,
                                 st.options.node_name));
  if (router_actor)
    caf::anon_send_exit(router_actor, caf::exit_reason::user_shutdown);
  if (st.plane)
    st.plane->close();
}

} // namespace troupe::actors
