#include "troupe/job.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "troupe/actors/node.hpp"
#include "troupe/command_line.hpp"
#include "troupe/parallel/remote.hpp"

#include "finish_hook.hpp"
#include "stop_within.hpp"

namespace troupe {

namespace {

using namespace std::chrono_literals;

/// How long the driver waits for one rank to reach its own finish() and
/// take the release (a rank still computing then is a program error).
constexpr auto release_timeout = 60s;

/// The job actor of every rank: answers its rank (get), tells the driver
/// once this rank is ready to be released (wait_for), and takes the
/// driver's release (delete) once this rank is ready for it (put, sent by
/// its own finish() or serve()): the driver's node must outlive every
/// rank's last collective, so a release that comes early is answered only
/// then.
/// Built-in atoms only, so no message type needs registering.
caf::behavior job_actor(caf::event_based_actor* self, std::uint32_t rank, std::function<void()> released) {
  struct pending_release {
    bool ready = false;
    std::optional<caf::response_promise> waiting;
    std::vector<caf::response_promise> ready_waiters; // wait_for: answered once ready, no release
  };
  auto state = std::make_shared<pending_release>();
  return {
    [rank](caf::get_atom) { return rank; },
    [self, state, released](caf::delete_atom) -> caf::result<caf::ok_atom> {
      if (state->ready) {
        released();
        return caf::ok_atom::value;
      }
      state->waiting = self->make_response_promise();
      return caf::delegated<caf::ok_atom>{};
    },
    [self, state](caf::wait_for_atom) -> caf::result<caf::ok_atom> {
      if (state->ready)
        return caf::ok_atom::value;
      state->ready_waiters.push_back(self->make_response_promise());
      return caf::delegated<caf::ok_atom>{};
    },
    [state, released](caf::put_atom) {
      state->ready = true;
      for (auto& waiter : state->ready_waiters)
        waiter.deliver(caf::ok_atom::value);
      state->ready_waiters.clear();
      if (state->waiting) {
        released();
        state->waiting->deliver(caf::ok_atom::value);
        state->waiting.reset();
      }
    },
  };
}

/// The driver's end of the job, narrated: (1) every other rank is asked to
/// say when it has reached its own finish() or serve() (wait_for); (2) once
/// all have, all are released (delete). A rank whose process is lost is
/// settled by its monitor's down message instead: CAF drops a message to a
/// lost node's actor without an answer, so a request to it would wait out
/// its whole timeout (a minute). A killed rank is seen at once, a stopped
/// one after the heartbeat timeout. `done` is filled once both phases are
/// settled.
struct release_progress {
  std::vector<caf::actor> ranks;
  std::shared_ptr<std::promise<void>> done;
  std::set<caf::actor_addr> pending; // the current phase's ranks not settled yet
  std::set<caf::actor_addr> lost;
  bool releasing = false; // phase (2)
};

void ask_every_rank(caf::event_based_actor* self, const std::shared_ptr<release_progress>& st);

/// The current phase has nothing left to wait for: on to the next.
void end_phase(caf::event_based_actor* self, const std::shared_ptr<release_progress>& st) {
  if (st->releasing) {
    st->done->set_value();
    self->quit();
    return;
  }
  st->releasing = true;
  ask_every_rank(self, st);
}

void settle_rank(caf::event_based_actor* self, const std::shared_ptr<release_progress>& st,
                 const caf::actor_addr& who) {
  if (st->pending.erase(who) == 1 && st->pending.empty())
    end_phase(self, st);
}

void ask_every_rank(caf::event_based_actor* self, const std::shared_ptr<release_progress>& st) {
  for (const auto& r : st->ranks)
    if (!st->lost.count(r.address()))
      st->pending.insert(r.address());
  if (st->pending.empty()) { // every rank lost
    end_phase(self, st);
    return;
  }
  for (const auto& r : st->ranks) {
    if (st->lost.count(r.address()))
      continue;
    auto answered = [self, st, who = r.address()](caf::ok_atom) { settle_rank(self, st, who); };
    auto failed = [self, st, who = r.address()](caf::error&) { settle_rank(self, st, who); }; // gone or late
    if (st->releasing)
      self->request(r, release_timeout, caf::delete_atom::value).then(answered, failed);
    else
      self->request(r, release_timeout, caf::wait_for_atom::value).then(answered, failed);
  }
}

caf::behavior release_ranks(caf::event_based_actor* self, std::vector<caf::actor> ranks,
                            std::shared_ptr<std::promise<void>> done) {
  auto st = std::make_shared<release_progress>();
  std::erase_if(ranks, [](const caf::actor& r) { return !r; });
  st->ranks = std::move(ranks);
  st->done = std::move(done);
  self->set_down_handler([self, st](caf::down_msg& msg) {
    st->lost.insert(msg.source);
    settle_rank(self, st, msg.source);
  });
  for (const auto& r : st->ranks)
    self->monitor(r);
  ask_every_rank(self, st);
  return {[](caf::ok_atom) {}};
}

/// How long a node may take to stop once the job's work is done: longer
/// than any bounded wait inside it (leaving the registry, the data plane's
/// goodbye), shorter than a launcher's timeout.
constexpr auto stop_bound = 60s;

} // namespace

struct job::state {
  state(int argc, char** argv) : flags(argc, argv), program(flags.program()) {
    for (int i = 1; i < argc; ++i)
      args.emplace_back(argv[i]);
  }
  command_line flags;
  std::vector<std::string> args; // argv[1..], for the node's --troupe.* flags
  std::string program;
  std::optional<parallel::stage_recipe> recipe;
  std::unique_ptr<actors::node> node;
  caf::actor self_actor;
  caf::actor driver_watch; // ranks > 0: ends serve() when the driver is lost
  std::vector<caf::actor> rank_actors; // by rank
  std::vector<std::string> node_names; // by rank
  std::promise<int> served;            // 0: released by the driver, 1: the driver is lost
  std::string driver_lost;             // why, when served is 1
  std::shared_ptr<parallel::finish_hooks> at_finish = std::make_shared<parallel::finish_hooks>();
  std::atomic<bool> serve_decided{false};
  bool finished = false;
  bool serving = false; // serve(): hooks run after the release, not before
  std::int64_t print_every = 10;

  void decide(int code) {
    if (!serve_decided.exchange(true))
      served.set_value(code);
  }

  /// Stops and forgets a node whose start failed half-way.
  void abandon_node() {
    stop_node();
    node.reset();
  }

  /// stop_node() at the job's end, bounded: past stop_bound the process
  /// ends with `status` (an actor left running keeps CAF's shutdown
  /// waiting forever).
  void stop_node_within(int status) {
    parallel::stop_within(stop_bound, program, status, [this] { stop_node(); });
  }

  void stop_node() {
    for (auto* actor : {&self_actor, &driver_watch})
      if (*actor) {
        caf::anon_send_exit(*actor, caf::exit_reason::user_shutdown);
        *actor = nullptr;
      }
    rank_actors.clear();
    std::fflush(stdout);
    if (node)
      node->stop();
  }
};

job::job(int argc, char** argv) : state_(std::make_unique<state>(argc, argv)) {}

job::~job() {
  if (state_ && !state_->finished && state_->node)
    finish(0);
}

job::job(job&&) noexcept = default;
job& job::operator=(job&&) noexcept = default;

std::int64_t job::flag(std::string_view name, std::int64_t fallback, std::int64_t low, std::int64_t high) {
  return state_->flags.integer(name, fallback, low, high);
}

std::string job::flag(std::string_view name, std::string fallback, const std::vector<std::string>& allowed) {
  return state_->flags.choice(name, std::move(fallback), allowed);
}

std::string job::flag(std::string_view name, std::string fallback) {
  return state_->flags.text(name, std::move(fallback));
}

device job::flag(std::string_view name, device fallback) { return state_->flags.device_here(name, fallback); }

void job::reject(std::string message) {
  state_->flags.reject(std::move(message));
}

void job::host_stages(const parallel::stage_recipe& recipe) {
  require(!state_->node, "job::host_stages: call it before start()");
  state_->recipe = recipe;
}

void job::start() {
  auto started = try_start();
  if (started)
    return;
  fmt::print(stderr, "{}: {}\n", state_->program, started.error().message());
  std::fflush(stdout);
  std::exit(started.error().code() == errc::invalid_argument ? 2 : 1);
}

expected<void> job::try_start() {
  auto& st = *state_;
  require(!st.node, "job::start: the job has started already");
  st.print_every = flag("print-every", 10, 1, 1'000'000'000);
  // Usage first, before anything listens: every flag was read by now.
  if (auto usage = st.flags.finish(); !usage)
    return usage;
  std::vector<const char*> argv{st.program.c_str()};
  for (const auto& a : st.args)
    argv.push_back(a.c_str());
  auto options = actors::node_options::from(static_cast<int>(argv.size()), argv.data());
  if (!options)
    return options.error();
  return join(*options);
}

expected<job> job::local(std::string node_name) {
  job out(0, nullptr);
  out.state_->program = node_name;
  actors::node_options options;
  options.name = std::move(node_name);
  options.local_only = true;
  if (auto joined = out.join(options); !joined)
    return joined.error();
  return out;
}

expected<void> job::join(const actors::node_options& options) {
  auto& st = *state_;
  auto started = actors::node::start(options);
  if (!started)
    return started.error();
  st.node = std::move(*started);
  auto& n = *st.node;
  if (st.recipe)
    parallel::register_stage_factory(n, *st.recipe);
  // Registered after the factories: a rank whose job actor is found can
  // host whatever the driver asks of it.
  auto* raw = state_.get();
  st.self_actor = n.system().spawn(job_actor, n.rank(), [raw] { raw->decide(0); });
  auto own = actors::place::parse(n.name() + "/cpu/job");
  if (!own) {
    st.abandon_node();
    return own.error();
  }
  if (auto ok = n.register_actor(*own, st.self_actor); !ok) {
    st.abandon_node();
    return ok.error();
  }

  // Every rank learns every rank's node name: ask each node's job actor.
  const auto world = n.options().world_size;
  auto fail = [&](const troupe::error& e) -> expected<void> {
    st.abandon_node();
    return e;
  };
  if (auto joined = n.wait_for_nodes(world, n.options().join_timeout); !joined)
    return fail(joined.error());
  auto names = n.nodes();
  if (!names)
    return fail(names.error());
  st.node_names.assign(world, {});
  st.rank_actors.assign(world, {});
  // The scoped actor must be gone before a failure stops the node.
  auto ask_ranks = [&]() -> expected<void> {
    caf::scoped_actor self{n.system()};
    for (const auto& name : *names) {
      auto where = actors::place::parse(name + "/cpu/job");
      if (!where)
        return where.error();
      auto found = n.await_actor(*where, n.options().join_timeout);
      if (!found)
        return found.error();
      std::optional<std::uint32_t> rank;
      std::string why;
      self->request(*found, n.options().request_timeout, caf::get_atom::value)
        .receive([&](std::uint32_t r) { rank = r; }, [&](caf::error& e) { why = n.system().render(e); });
      if (!rank)
        return make_error(errc::io_error, "job: node {} did not say its rank: {}", name, why);
      if (*rank >= world || !st.node_names[*rank].empty())
        return make_error(errc::invalid_argument, "job: node {} has rank {}, which is {} (world size {})", name,
                          *rank, *rank >= world ? "out of range" : "taken", world);
      st.node_names[*rank] = name;
      st.rank_actors[*rank] = *found;
    }
    return {};
  };
  if (auto asked = ask_ranks(); !asked)
    return fail(asked.error());
  for (std::uint32_t r = 0; r < world; ++r)
    if (st.node_names[r].empty())
      return fail(troupe::error(errc::io_error, fmt::format("job: no node has rank {}", r)));
  if (!is_driver()) {
    // The registry reports lost peers, but it lives on the driver's node:
    // the driver's own loss is seen by monitoring its job actor (the
    // connection breaking, or heartbeats missing, end it).
    st.driver_watch = n.system().spawn([raw, driver = st.rank_actors[0]](caf::event_based_actor* self) {
      self->monitor(driver);
      self->set_down_handler([raw, self](caf::down_msg& msg) {
        raw->driver_lost = self->system().render(msg.reason); // read after served's future, so no race
        raw->decide(1);
        self->quit();
      });
      return caf::behavior{[](caf::ok_atom) {}};
    });
  }
  return {};
}

std::uint32_t job::rank() const {
  require(state_->node != nullptr, "job::rank: the job has not started");
  return state_->node->rank();
}

std::uint32_t job::restart() const {
  require(state_->node != nullptr, "job::restart: the job has not started");
  return state_->node->options().restart;
}

std::uint32_t job::world_size() const {
  require(state_->node != nullptr, "job::world_size: the job has not started");
  return state_->node->options().world_size;
}

const std::vector<std::string>& job::nodes() const {
  require(state_->node != nullptr, "job::nodes: the job has not started");
  return state_->node_names;
}

std::vector<std::string> job::places(std::string_view device) const {
  require(state_->node != nullptr, "job::places: the job has not started");
  std::vector<std::string> out;
  for (const auto& name : state_->node_names)
    out.push_back(fmt::format("{}/{}", name, device));
  return out;
}

actors::node& job::node() {
  require(state_->node != nullptr, "job::node: the job has not started");
  return *state_->node;
}

const std::string& job::program() const {
  return state_->program;
}

const parallel::stage_recipe& job::stages() const {
  require(state_->recipe.has_value(), "job: no stage recipe; call host_stages(recipe) before start()");
  return *state_->recipe;
}

void job::fail(const error& why, std::string_view context) {
  if (context.empty())
    fmt::print(stderr, "{}: {}\n", state_->program, why.message());
  else
    fmt::print(stderr, "{}: {}: {}\n", state_->program, context, why.message());
  if (state_->node && is_driver())
    finish(1);
  // A failing rank other than the driver must not wait for a release: it
  // leaves, and the driver's collectives and pipelines report it lost.
  std::fflush(stdout);
  std::exit(1);
}

void job::step::report(double loss, std::int64_t samples_per_step, std::string_view extra) const {
  if (!owner_->is_driver())
    return;
  const auto every = owner_->state_->print_every;
  if (number_ != first_ && number_ % every != 0 && number_ != last_)
    return;
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
  fmt::print("step {:4}  loss {:.4f}  samples/s {:.1f}{}\n", number_, loss,
             static_cast<double>((number_ - first_ + 1) * samples_per_step) / elapsed.count(), extra);
}

int job::serve() {
  require(state_->node != nullptr && !is_driver(), "job::serve: for started ranks other than the driver");
  // What this rank hosts (a parameter server) serves until the release.
  state_->serving = true;
  return finish(0);
}

std::uint64_t parallel::finish_hooks::add(std::function<void()> stop) {
  std::lock_guard lock(mutex_);
  const auto id = next_++;
  stops_.emplace_back(id, std::move(stop));
  return id;
}

void parallel::finish_hooks::forget(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  std::erase_if(stops_, [id](const auto& hook) { return hook.first == id; });
}

void parallel::finish_hooks::run_all() {
  for (;;) {
    std::function<void()> stop;
    {
      std::lock_guard lock(mutex_);
      if (stops_.empty())
        break;
      stop = std::move(stops_.back().second);
      stops_.pop_back();
    }
    stop();
  }
}

parallel::finish_hook::finish_hook(troupe::job& job, std::function<void()> stop)
    : hooks_(job.state_->at_finish), id_(job.state_->at_finish->add(std::move(stop))) {}

int job::finish(int status) {
  auto& st = *state_;
  require(st.node != nullptr, "job::finish: the job has not started");
  if (st.finished)
    return status;
  st.finished = true;
  std::fflush(stdout);
  if (!st.serving)
    st.at_finish->run_all();
  if (is_driver() && status != 0) {
    // A failing driver waits for nobody: a rank still working (in a
    // collective with a lost peer, or with this driver) might need its
    // collective's whole timeout to get here. Ranks that serve take the
    // release now; the others learn of the driver's loss.
    for (std::size_t r = 1; r < st.rank_actors.size(); ++r)
      if (st.rank_actors[r])
        caf::anon_send(st.rank_actors[r], caf::delete_atom::value);
    // Bounded as an orderly end is: a failure is when an actor is likeliest
    // to be left running.
    st.stop_node_within(status);
    return status;
  }
  if (is_driver()) {
    // Every rank first reaches its finish() or serve(), then all are
    // released: ranks that serve others (parameter servers) outlive every
    // rank that still works. Each request is bounded, so the wait is too.
    auto done = std::make_shared<std::promise<void>>();
    auto settled = done->get_future();
    std::vector<caf::actor> others(st.rank_actors.begin() + std::min<std::size_t>(1, st.rank_actors.size()),
                                   st.rank_actors.end());
    { // no handle of ours may outlive the node
      auto releaser = st.node->system().spawn(release_ranks, std::move(others), done);
      if (settled.wait_for(2 * release_timeout + 5s) != std::future_status::ready)
        caf::anon_send_exit(releaser, caf::exit_reason::user_shutdown);
    }
    st.stop_node_within(status);
    return status;
  }
  // Other ranks wait for the driver's release (their last collective may
  // still need the driver's node), or for the driver's loss. The driver may
  // still be working, so the wait has no bound; it is reported instead.
  caf::anon_send(st.self_actor, caf::put_atom::value);
  auto decided = st.served.get_future();
  for (auto waited = 0s; decided.wait_for(30s) != std::future_status::ready;) {
    waited += 30s;
    fmt::print(stderr, "{}: rank {}: waiting for the driver's release for {} s\n", st.program, rank(),
               waited.count());
  }
  const bool released = decided.get() == 0;
  if (st.serving)
    st.at_finish->run_all();
  if (released) {
    st.stop_node_within(status);
    return status;
  }
  // The driver's process is gone, and the coordinator with it: an orderly
  // stop would wait on CAF's shutdown for a peer that no longer answers
  // (seen: forever). The process is about to end; let the operating
  // system reclaim the node.
  std::fflush(stdout);
  fmt::print(stderr, "{}: the driver ({}) was lost: {}\n", st.program, st.node_names.at(0), st.driver_lost);
  static_cast<void>(st.node.release());
  return 1;
}

} // namespace troupe
