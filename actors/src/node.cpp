#include "troupe/actors/node.hpp"

#include <algorithm>
#include <cstdlib>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <optional>
#include <thread>
#include <tuple>
#include <type_traits>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "troupe/actors/error_category.hpp"
#include "troupe/actors/message_types.hpp"
#include "troupe/actors/network_interface.hpp"
#include "registry.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/tensor/intra_op_threads.hpp"

#include "control_plane_connect.hpp"
#include "control_plane_listener.hpp"
#include "control_plane_tls.hpp"
#include "stop_watch.hpp"

// Scheduler defaults, measured on the 2-core development machine (Node.
// DISABLED_SmallMessageRoundTrip in tests/actors/node_test.cpp: median round
// trip of an int request to an event-based actor in another node process
// over loopback, 2000 samples, while other builds shared the cores):
//   policy=stealing, max-threads=4 (CAF's default)  213 us  (p90 233 us)
//   policy=stealing, max-threads=2                  214 us  (p90 226 us)
//   policy=sharing,  max-threads=1                   80 us  (p90 104 us)
//   policy=sharing,  max-threads=4                   64-90 us (p90 83-106 us)
//   policy=sharing,  max-threads=2                   58-80 us (p90 78-94 us)
// Work stealing's idle workers sleep and every hop pays their wake-up; the
// sharing policy wakes a waiting worker directly. So the default is sharing
// with one worker per core.

namespace troupe::actors {

using namespace std::chrono_literals;

struct node::state {
  std::mutex mutex;
  std::map<std::string, actor_factory> factories;
  std::map<std::uint64_t, peer_lost_handler> handlers; // by id, in registration order
  std::uint64_t next_handler = 1;
  std::vector<caf::actor> spawned;
  /// Actors of this node registered by register_actor, by place: stopped
  /// with the node unless unregistered first.
  std::map<std::string, caf::actor> registered;
  std::string node_name;
  std::string coordinator_name;
  caf::actor registry;
  std::chrono::milliseconds request_timeout{10000};
  std::shared_ptr<tensor_router> router;
  /// What a control-plane connection must show: the job token in its
  /// preamble and, with TLS, a certificate from the job's CA.
  std::uint64_t control_token = 0;
  std::shared_ptr<const control_plane::tls_context> tls;
  /// Why the coordinator's registry went down, once it has (empty before).
  std::string registry_gone;

  /// "the coordinator worker0 is gone (...)" once its registry is down,
  /// empty before.
  std::string registry_gone_message() {
    std::lock_guard<std::mutex> guard(mutex);
    if (registry_gone.empty())
      return {};
    return fmt::format("the coordinator {} is gone ({})", coordinator_name, registry_gone);
  }

  caf::actor registry_now() {
    std::lock_guard<std::mutex> guard(mutex);
    return registry;
  }

  std::shared_ptr<tensor_router> router_now() {
    std::lock_guard<std::mutex> guard(mutex);
    return router;
  }

  void report(const peer_lost& event) {
    std::vector<peer_lost_handler> copy;
    std::shared_ptr<tensor_router> r;
    {
      std::lock_guard<std::mutex> guard(mutex);
      for (const auto& [id, handler] : handlers)
        copy.push_back(handler);
      r = router;
    }
    // The router first: by the time user code hears of the loss, sends to
    // that node already fail.
    if (r)
      r->on_peer_lost(event);
    for (auto& handler : copy)
      handler(event);
  }
};

namespace {

troupe::error to_troupe_error(caf::actor_system& system, const caf::error& err, std::string_view what) {
  if (err.category() == error_category) {
    auto& context = err.context();
    auto text = context.match_elements<std::string>() ? context.get_as<std::string>(0) : system.render(err);
    return troupe::error(static_cast<errc>(err.code()), fmt::format("{}: {}", what, text));
  }
  if (err == caf::sec::request_timeout)
    return make_error(errc::io_error, "{}: no reply in time (request timed out)", what);
  return make_error(errc::io_error, "{}: {}", what, system.render(err));
}

// One blocking request with a finite timeout; the reply must be an R.
template <class R, class... Ts>
troupe::expected<R> ask(caf::actor_system& system, const caf::actor& destination, std::chrono::milliseconds timeout,
                        std::string_view what, Ts&&... xs) {
  if (!destination)
    return make_error(errc::invalid_argument, "{}: no actor to ask", what);
  caf::scoped_actor self{system};
  std::optional<troupe::expected<R>> result;
  self->request(destination, timeout, std::forward<Ts>(xs)...)
    .receive([&](R& value) { result.emplace(std::move(value)); },
             [&](caf::error& err) { result.emplace(to_troupe_error(system, err, what)); });
  return std::move(*result);
}

// A request to the coordinator's registry. Once the registry is known to be
// down (its node stopped or was lost), the request fails, naming the
// coordinator: at once when it was down before, within a poll interval when
// it goes down while the request waits. Otherwise every call would wait out
// its timeout (10 s by default; await_actor's can be minutes), and a caller
// retrying a lookup would wait for minutes. The request runs in a helper
// actor that fills a promise, so the caller can stop waiting early.
template <class R, class... Ts>
troupe::expected<R> ask_registry(caf::actor_system& system, node::state& st, std::chrono::milliseconds timeout,
                                  std::string_view what, Ts&&... xs) {
  if (auto gone = st.registry_gone_message(); !gone.empty())
    return make_error(errc::io_error, "{}: {}", what, gone);
  auto registry = st.registry_now();
  if (!registry)
    return make_error(errc::invalid_argument, "{}: no actor to ask", what);
  auto reply = std::make_shared<std::promise<troupe::expected<R>>>();
  auto answered = reply->get_future();
  auto helper = system.spawn([reply, registry, timeout, what = std::string(what),
                args = std::make_tuple(std::decay_t<Ts>(std::forward<Ts>(xs))...)](caf::event_based_actor* self) {
    std::apply([&](const auto&... a) { return self->request(registry, timeout, a...); }, args)
      .then([reply](R& value) { reply->set_value(std::move(value)); },
            [reply, self, what](caf::error& err) { reply->set_value(to_troupe_error(self->system(), err, what)); });
  });
  // The helper's request has its own timeout, so this loop ends.
  while (answered.wait_for(std::chrono::milliseconds{20}) != std::future_status::ready)
    if (auto gone = st.registry_gone_message(); !gone.empty()) {
      // Stop the helper too: its pending request would keep it, and the
      // actor system's shutdown, alive until the request's timeout.
      caf::anon_send_exit(helper, caf::exit_reason::user_shutdown);
      return make_error(errc::io_error, "{}: {}", what, gone);
    }
  return answered.get();
}

caf::expected<caf::actor> call_factory(caf::actor_system& system, const actor_factory& factory, const place& where,
                                       const caf::message& args) {
  try {
    auto handle = factory(system, where, args);
    if (handle && !*handle)
      return make_caf_error(errc::invalid_argument, "factory for " + where.to_string() + " returned no actor");
    return handle;
  } catch (const std::exception& e) {
    // Never let a factory's exception escape the agent's handler.
    return make_caf_error(errc::invalid_argument, "factory for " + where.to_string() + " threw: " + e.what());
  }
}

caf::result<caf::actor> spawn_here(caf::event_based_actor* self, const std::shared_ptr<node::state>& st,
                                   const std::string& text, const std::string& factory_name,
                                   const caf::message& args) {
  auto where = place::parse_named(text);
  if (!where)
    return to_caf_error(where.error());
  if (where->node != st->node_name)
    return make_caf_error(errc::invalid_argument,
                          "node " + st->node_name + " was asked to spawn " + text + ", which is on another node");
  if (auto gone = st->registry_gone_message(); !gone.empty()) // the spawned actor could not be registered
    return make_caf_error(errc::io_error, "spawn " + text + ": " + gone);
  actor_factory factory;
  {
    std::lock_guard<std::mutex> guard(st->mutex);
    auto i = st->factories.find(factory_name);
    if (i == st->factories.end())
      return make_caf_error(errc::invalid_argument,
                            "node " + st->node_name + " has no factory named \"" + factory_name + "\"");
    factory = i->second;
  }
  auto handle = call_factory(self->system(), factory, *where, args);
  if (!handle)
    return std::move(handle.error());
  {
    std::lock_guard<std::mutex> guard(st->mutex);
    st->spawned.push_back(*handle);
  }
  auto promise = self->make_response_promise();
  auto spawned = *handle;
  self->request(st->registry_now(), st->request_timeout, reg_name_atom_v, text, spawned)
    .then([promise, spawned, st, text](caf::ok_atom) mutable {
            if (auto r = st->router_now())
              r->attach(text, spawned);
            promise.deliver(spawned);
          },
          [promise, spawned](caf::error& err) mutable {
            caf::anon_send_exit(spawned, caf::exit_reason::user_shutdown);
            promise.deliver(std::move(err));
          });
  return promise;
}

// The node agent: spawns actors by factory name, forwards spawns for other
// nodes, and turns loss reports into peer_lost callbacks.
caf::behavior node_agent(caf::event_based_actor* self, std::shared_ptr<node::state> st) {
  self->monitor(st->registry_now());
  self->set_down_handler([self, st](caf::down_msg& msg) {
    if (msg.source != st->registry_now().address())
      return;
    std::string coordinator;
    auto reason = self->system().render(msg.reason);
    {
      std::lock_guard<std::mutex> guard(st->mutex);
      coordinator = st->coordinator_name;
      st->registry_gone = reason.empty() ? "no reason given" : reason;
    }
    st->report(peer_lost{coordinator, {}, reason});
  });
  return {
    [self, st](spawn_here_atom, const std::string& text, const std::string& factory_name,
               const caf::message& args) { return spawn_here(self, st, text, factory_name, args); },
    [self, st](spawn_at_atom, const std::string& text, const std::string& factory_name,
               const caf::message& args) -> caf::result<caf::actor> {
      auto where = place::parse_named(text);
      if (!where)
        return to_caf_error(where.error());
      if (where->node == st->node_name)
        return spawn_here(self, st, text, factory_name, args);
      if (auto gone = st->registry_gone_message(); !gone.empty())
        return make_caf_error(errc::io_error, "spawn " + text + ": " + gone);
      auto promise = self->make_response_promise();
      self->request(st->registry_now(), st->request_timeout, lookup_node_atom_v, where->node)
        .then(
          [self, st, promise, text, factory_name, args](const caf::actor& remote_agent) mutable {
            self->request(remote_agent, st->request_timeout, spawn_here_atom_v, text, factory_name, args)
              .then([promise](const caf::actor& spawned) mutable { promise.deliver(spawned); },
                    [promise](caf::error& err) mutable { promise.deliver(std::move(err)); });
          },
          [promise](caf::error& err) mutable { promise.deliver(std::move(err)); });
      return promise;
    },
    [st](node_lost_atom, const std::string& name, const std::vector<std::string>& actors,
         const std::string& reason) { st->report(peer_lost{name, actors, reason}); },
    // A tensor sent to this node over CAF (TLS on): hand it to its actor.
    [st](deliver_atom, tensor_message& message) -> caf::result<caf::ok_atom> {
      auto r = st->router_now();
      if (!r)
        return make_caf_error(errc::io_error, "node " + st->node_name + " has no tensor router");
      r->deliver(std::move(message));
      return caf::ok_atom::value;
    },
    [](joined_atom, const std::string&) {
      // Nothing to do yet; joins are visible through the registry.
    },
  };
}

std::uint64_t hash_token(std::string_view text) {
  std::uint64_t token = 0xcbf29ce484222325ull; // FNV-1a
  for (char c : text)
    token = (token ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return token == 0 ? 1 : token;
}

// The token every control-plane connection carries in its preamble
// (control_plane_preamble.hpp): the job's secret (TROUPE_JOB_TOKEN, set by
// troupe-launch for every rank), or without one a fixed value that still
// keeps every client that does not speak troupe away from BASP.
std::uint64_t control_plane_token(const node_options& options) {
  return hash_token(options.job_token.empty() ? std::string_view("troupe: no job token configured")
                                              : std::string_view(options.job_token));
}

// The data plane's per-job token, handed to every node at join (registry,
// job_token): the job's secret when one is configured, random per job
// otherwise, so frames from an earlier job on the same ports are dropped.
// It is not a secret against an eavesdropper: UCX sends it in the clear;
// TLS is the answer to that.
std::uint64_t data_plane_token(const node_options& options) {
  if (!options.job_token.empty())
    return hash_token(options.job_token);
  std::random_device device;
  auto token = (std::uint64_t{device()} << 32) ^ device();
  return token == 0 ? 1 : token;
}

std::int64_t system_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
    .count();
}

std::string seconds(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000.0);
}

} // namespace

node::node(node_options options) : options_(std::move(options)), state_(std::make_shared<state>()) {
  state_->node_name = options_.name;
  state_->request_timeout = options_.request_timeout;
}

node::~node() {
  stop();
}

troupe::expected<std::unique_ptr<node>> node::start(node_options options) {
  if (auto ok = options.validate(); !ok)
    return make_error(errc::invalid_argument, "node {}: {}", options.name, ok.error().message());
  const bool tls = options.tls.requested();
  // TLS files are checked before CAF's module sees them: it would fall back
  // to anonymous TLS or hang on a bad key (docs/api-notes.md).
  if (tls)
    if (auto ok = validate(options.tls); !ok)
      return troupe::error(ok.error().code(), fmt::format("node {}: {}", options.name, ok.error().message()));
  // A job whose coordinator is a loopback address runs on this host: its
  // nodes listen on loopback only, so that nothing of the job is reachable
  // from, or reaches, the machine's other addresses.
  if (options.listen_address.empty() && is_loopback_address(options.coordinator.host))
    options.listen_address = options.coordinator.host == "localhost" ? "127.0.0.1" : options.coordinator.host;
  // Process-wide, like the OpenBLAS count it sets; a node only changes it
  // when asked to.
  if (options.intra_op_threads != 0)
    set_intra_op_threads(static_cast<int>(options.intra_op_threads));
  std::unique_ptr<node> self(new node(std::move(options)));
  auto& opts = self->options_;
  // Tracing first, so that joining and the clock measurement are recorded.
  if (!trace::enabled()) {
    if (auto ok = trace::start_from_environment(opts.name, opts.rank); !ok)
      return troupe::error(ok.error().code(), fmt::format("node {}: {}", opts.name, ok.error().message()));
    self->traced_ = trace::enabled();
  }
  // TLS is troupe's, not CAF's OpenSSL module (control_plane_tls.hpp).
  self->state_->control_token = control_plane_token(opts);
  if (tls) {
    auto context = control_plane::tls_context::load(opts.tls);
    if (!context)
      return troupe::error(context.error().code(), fmt::format("node {}: {}", opts.name, context.error().message()));
    self->state_->tls = std::move(*context);
  }
  auto config = std::make_unique<caf::actor_system_config>();
  config->load<caf::io::middleman>();
  add_message_types(*config);
  config->set("scheduler.policy", caf::atom_from_string(opts.scheduler.policy));
  auto threads = opts.scheduler.max_threads > 0 ? opts.scheduler.max_threads
                                                : std::max(1u, std::thread::hardware_concurrency());
  config->set("scheduler.max-threads", static_cast<std::size_t>(threads));
  if (opts.scheduler.middleman_workers > 0)
    config->set("middleman.workers", static_cast<std::size_t>(opts.scheduler.middleman_workers));
  // Heartbeats on every node: configured on one side only, idle peers are
  // declared dead (docs/api-notes.md).
  config->set("middleman.heartbeat-interval", caf::timespan{opts.heartbeat_interval});
  config->set("middleman.connection-timeout", caf::timespan{opts.heartbeat_timeout});
  self->config_ = std::move(config);
  self->system_ = std::make_unique<caf::actor_system>(*self->config_);
  if (auto ok = self->join(); !ok) {
    self->stop();
    return ok.error();
  }
  if (auto ok = self->start_router(); !ok) {
    self->stop();
    return ok.error();
  }
  return self;
}

troupe::expected<void> node::join() {
  auto& sys = *system_;
  auto listen = [&](const caf::actor& whom, std::uint16_t port) -> troupe::expected<std::uint16_t> {
    control_plane::listener_options guard;
    guard.node_name = options_.name;
    guard.token = state_->control_token;
    guard.tls = state_->tls;
    auto result = control_plane::publish(sys, whom, port, options_.listen_address, std::move(guard));
    if (!result)
      return make_error(errc::io_error, "node {} could not listen on port {}: {}", options_.name, port,
                        result.error().message());
    return *result;
  };
  std::map<std::string, std::string> maps;
  for (auto& [destination, map] : options_.device_maps)
    maps[destination] = map.to_string();

  if (options_.is_coordinator()) {
    registry_ = spawn_registry(sys, options_.name, data_plane_token(options_));
    if (!options_.local_only) { // nobody joins a local-only node: no listener
      auto port = listen(registry_, options_.coordinator.port);
      if (!port)
        return port.error();
      port_ = *port;
    }
  } else {
    // Connect with a deadline (CAF's remote_actor() blocks forever on a
    // stopped peer), through the guarded control plane. A refused
    // connection is retried (the launcher starts every rank at once) until
    // the join timeout.
    auto coordinator = options_.coordinator;
    auto deadline = std::chrono::steady_clock::now() + options_.join_timeout;
    std::string last_error = "no attempt";
    for (;;) {
      auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (remaining <= 0ms)
        break;
      auto registry = control_plane::connect(sys, coordinator.host, coordinator.port, state_->control_token,
                                             state_->tls, remaining);
      if (registry)
        registry_ = std::move(*registry);
      else
        last_error = registry.error().message();
      if (registry_ || std::chrono::steady_clock::now() + 100ms >= deadline)
        break;
      std::this_thread::sleep_for(100ms);
    }
    if (!registry_)
      return make_error(errc::io_error, "node {} could not join coordinator {} within {}: {}", options_.name,
                        coordinator.to_string(), seconds(options_.join_timeout), last_error);
  }
  {
    std::lock_guard<std::mutex> guard(state_->mutex);
    state_->registry = registry_;
  }
  agent_ = sys.spawn(node_agent, state_);
  if (!options_.is_coordinator()) {
    auto port = listen(agent_, options_.port);
    if (!port)
      return port.error();
    port_ = *port;
  }
  // Registering is still joining: a coordinator that accepted the
  // connection and then stopped answering fails the join within its bound.
  auto what = fmt::format("node {} could not join coordinator {} (registering)", options_.name,
                          options_.coordinator.to_string());
  auto joined = ask<std::string>(sys, registry_, std::min(options_.request_timeout, options_.join_timeout), what,
                                  reg_node_atom_v, options_.name, agent_, maps);
  if (!joined)
    return joined.error();
  std::lock_guard<std::mutex> guard(state_->mutex);
  state_->coordinator_name = *joined;
  return {};
}

troupe::expected<void> node::start_router() {
  auto& sys = *system_;
  const auto timeout = options_.request_timeout;
  auto token = ask<std::uint64_t>(sys, registry_, std::min(timeout, options_.join_timeout),
                                  fmt::format("node {} could not join coordinator {} (job token)", options_.name,
                                              options_.coordinator.to_string()),
                                  job_token_atom_v);
  if (!token)
    return token.error();
  // Clock offset to the coordinator for merging traces: a few round trips
  // that return the coordinator's system clock; the one with the smallest
  // round trip wins, and half of it is the uncertainty.
  if (trace::enabled()) {
    if (options_.is_coordinator()) {
      trace::set_clock_offset(0, 0);
    } else {
      std::int64_t best_rtt = std::numeric_limits<std::int64_t>::max(), best_offset = 0;
      for (int i = 0; i < 8; ++i) {
        auto t0 = system_now_ns();
        auto remote = ask<std::int64_t>(sys, registry_, timeout, "clock", clock_atom_v);
        auto t1 = system_now_ns();
        if (remote && t1 - t0 < best_rtt) {
          best_rtt = t1 - t0;
          best_offset = *remote - (t0 + (t1 - t0) / 2);
        }
      }
      if (best_rtt != std::numeric_limits<std::int64_t>::max())
        trace::set_clock_offset(best_offset, best_rtt / 2);
    }
  }
  tensor_router_options ro;
  ro.node_name = options_.name;
  ro.registry = registry_;
  ro.request_timeout = timeout;
  ro.without_data_plane = options_.tls.requested() || options_.local_only;
  ro.data_plane.token = *token;
  ro.arena_bytes = options_.local_only ? 0 : options_.arena_bytes;
  ro.copy_into_arena_min_bytes = options_.arena_copy_min_bytes;
  ro.device_maps = options_.device_maps;
  ro.data_plane.spin_before_sleep = options_.data_plane_spin;
  ro.data_plane.network_eager_bytes = options_.network_eager_bytes;
  ro.data_plane.keep_freed_heap_bytes = options_.keep_freed_heap_bytes;
  if (options_.data_plane_spin.count() == 0)
    ro.data_plane.spin_while_transferring = std::chrono::microseconds(0); // "never poll"
  // UCX's TCP lanes on the listen address's interface only (it would open
  // one on every interface), unless UCX_NET_DEVICES chooses.
  if (std::getenv("UCX_NET_DEVICES") == nullptr)
    ro.data_plane.net_devices = interface_for_address(options_.listen_address);
  auto router = tensor_router::start(sys, std::move(ro));
  if (!router)
    return router.error();
  {
    std::lock_guard<std::mutex> guard(state_->mutex);
    state_->router = *router;
  }
  if (!ro.without_data_plane) {
    auto ok = ask<caf::ok_atom>(sys, registry_, timeout, "node " + options_.name + ": publish data-plane address",
                                data_address_atom_v, options_.name, (*router)->data_plane_address());
    if (!ok)
      return ok.error();
  }
  return {};
}

std::shared_ptr<tensor_router> node::router() const {
  std::lock_guard<std::mutex> guard(state_->mutex);
  return state_->router;
}

void node::stop() {
  if (stopped_)
    return;
  stopped_ = true;
  stop_watch watch(options_.name, std::chrono::seconds{10});
  // Flush the trace whatever else happens.
  struct trace_guard {
    bool on;
    stop_watch& watch;
    ~trace_guard() {
      if (on) {
        watch.phase("flushing the trace");
        trace::stop();
      }
    }
  } flush{traced_, watch};
  if (!system_)
    return;
  // Leave first, so the others do not report this orderly stop as a loss.
  watch.phase("leaving the registry");
  if (registry_ && agent_)
    (void)ask_registry<caf::ok_atom>(*system_, *state_,
                                     std::min(options_.request_timeout, std::chrono::milliseconds{2000}), "leave",
                                     leave_atom_v, options_.name);
  std::vector<caf::actor> spawned;
  std::shared_ptr<tensor_router> router;
  {
    std::lock_guard<std::mutex> guard(state_->mutex);
    spawned.swap(state_->spawned);
    for (auto& [where, handle] : state_->registered)
      spawned.push_back(std::move(handle));
    state_->registered.clear();
    state_->handlers.clear();
    router.swap(state_->router);
  }
  // Goodbye on the data plane before the actors go.
  watch.phase("closing the data plane");
  if (router)
    router->stop();
  for (auto& handle : spawned)
    caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  spawned.clear();
  if (agent_)
    caf::anon_send_exit(agent_, caf::exit_reason::user_shutdown);
  if (registry_ && options_.is_coordinator())
    caf::anon_send_exit(registry_, caf::exit_reason::user_shutdown);
  agent_ = nullptr;
  registry_ = nullptr;
  {
    std::lock_guard<std::mutex> guard(state_->mutex);
    state_->registry = nullptr;
  }
  watch.phase("waiting for the node's actors to stop");
  await_actors_stopped();
  // The actor system's destructor waits for the actors stopped above.
  watch.phase("in the actor system's shutdown");
  system_.reset();
  config_.reset();
}

void node::await_actors_stopped() {
  // Wait until every actor of this system (hidden ones aside) has stopped,
  // before the middleman goes. The middleman's BASP broker keeps every
  // local actor known to another node monitored; the down message an actor
  // sends the broker as it stops carries a strong reference to that actor.
  // Arriving after the middleman stopped, it stayed in the broker's mailbox,
  // kept the stopped (detached) actor alive and the actor system's
  // destructor waiting for it forever: pipeline_demo --replicas=2 hung
  // about one run in ten on one rank, and a test with a killed stage hung
  // when a reducer stopped more than a second after the stop began (its
  // stage was still blocked on the dead replica, up to the ring's timeout);
  // gdb showed the down message as the stopped actor's last reference.
  // Actors block for at most their own timeouts, so this wait ends; the
  // bound only guards against an actor the user never stopped (which the
  // contract of stop() excludes), and a message says who is waited for.
  constexpr auto bound = std::chrono::seconds{120};
  constexpr auto report_after = std::chrono::seconds{2};
  const auto start = std::chrono::steady_clock::now();
  bool waited = false, reported = false;
  while (system_->registry().running() > 0) {
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed > bound) {
      fmt::print(stderr, "troupe node {}: {} actors still running after {} s; shutting down anyway (an actor "
                 "that was never stopped?)\n", options_.name, system_->registry().running(), bound.count());
      return;
    }
    if (!reported && elapsed > report_after) {
      reported = true;
      fmt::print(stderr, "troupe node {}: waiting for {} actors to stop before shutting down\n", options_.name,
                 system_->registry().running());
    }
    waited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds{2});
  }
  // The last down messages were enqueued as those actors stopped; let the
  // broker (on the multiplexer's thread) take them.
  if (waited)
    std::this_thread::sleep_for(std::chrono::milliseconds{10});
}

void node::register_factory(std::string name, actor_factory factory) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  state_->factories[std::move(name)] = std::move(factory);
}

std::uint64_t node::on_peer_lost(peer_lost_handler handler) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  const auto id = state_->next_handler++;
  state_->handlers.emplace(id, std::move(handler));
  return id;
}

void node::remove_peer_lost_handler(std::uint64_t id) {
  std::lock_guard<std::mutex> guard(state_->mutex);
  state_->handlers.erase(id);
}

troupe::expected<void> node::register_actor(const place& where, const caf::actor& handle) {
  // Attach to the local router first: once the registry knows the name,
  // peers may send to it at once, and a tensor arriving before the router
  // knew the actor would be dropped.
  auto local = where.node == options_.name ? router() : nullptr;
  if (local)
    local->attach(where.to_string(), handle);
  auto ok = ask_registry<caf::ok_atom>(*system_, *state_, options_.request_timeout, "register " + where.to_string(),
                                       reg_name_atom_v, where.to_string(), handle);
  if (!ok) {
    if (local)
      local->detach(where.to_string());
    return ok.error();
  }
  if (local) {
    std::lock_guard<std::mutex> guard(state_->mutex);
    state_->registered[where.to_string()] = handle;
  }
  return {};
}

troupe::expected<void> node::unregister_actor(const place& where) {
  if (auto r = router())
    r->detach(where.to_string());
  {
    std::lock_guard<std::mutex> guard(state_->mutex);
    state_->registered.erase(where.to_string());
  }
  auto ok = ask_registry<caf::ok_atom>(*system_, *state_, options_.request_timeout,
                                       "unregister " + where.to_string(), unreg_name_atom_v, where.to_string());
  if (!ok)
    return ok.error();
  return {};
}

troupe::expected<caf::actor> node::lookup(const place& where) {
  return ask_registry<caf::actor>(*system_, *state_, options_.request_timeout, "look up " + where.to_string(),
                                  lookup_name_atom_v, where.to_string());
}

troupe::expected<caf::actor> node::await_actor(const place& where, std::chrono::milliseconds timeout) {
  auto what = fmt::format("wait for {} to be registered ({} ms)", where.to_string(), timeout.count());
  return ask_registry<caf::actor>(*system_, *state_, timeout, what, await_name_atom_v, where.to_string(),
                                  static_cast<std::int64_t>(timeout.count()));
}

troupe::expected<caf::actor> node::spawn_remote(const place& where, const std::string& factory, caf::message args) {
  // The agent needs two request timeouts at most (lookup, then the spawn).
  return ask<caf::actor>(*system_, agent_, 2 * options_.request_timeout,
                         fmt::format("spawn {} with factory \"{}\"", where.to_string(), factory), spawn_at_atom_v,
                         where.to_string(), factory, std::move(args));
}

troupe::expected<void> node::wait_for_nodes(std::uint32_t count, std::chrono::milliseconds timeout) {
  auto ok = ask_registry<caf::ok_atom>(*system_, *state_, timeout, fmt::format("wait for {} nodes", count),
                                       await_nodes_atom_v, count);
  if (!ok)
    return ok.error();
  return {};
}

troupe::expected<std::vector<std::string>> node::nodes() {
  return ask_registry<std::vector<std::string>>(*system_, *state_, options_.request_timeout, "list nodes",
                                                list_nodes_atom_v);
}

troupe::expected<troupe::device> node::landing_device(const place& from, const place& to) {
  auto text = ask_registry<std::string>(*system_, *state_, options_.request_timeout,
                                        fmt::format("device map {} -> {}", from.node, to.node), device_map_atom_v,
                                        from.node, to.node);
  if (!text)
    return text.error();
  auto map = device_map::parse(*text);
  if (!map)
    return map.error();
  return map->landing(from.device);
}

} // namespace troupe::actors
