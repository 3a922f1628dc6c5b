#include "troupe/parallel/remote_module.hpp"

#include <atomic>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "troupe/actors/node.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/autograd/node.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/distributed_autograd.hpp"
#include "troupe/tensor/ops.hpp"

#include "actor_places.hpp"
#include "finish_hook.hpp"
#include "mailbox_thread.hpp"
#include "ps_wire.hpp"
#include "remote_module_checkpoint.hpp"
#include "reply_endpoint.hpp"
#include "training_state.hpp"

namespace troupe::parallel {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using detail::make_message;

namespace {

std::string host_place(const remote_module_options& o) { return fmt::format("{}/module_{}", o.place, o.name); }

std::string caller_place(const remote_module_options& o, std::uint32_t i) {
  return fmt::format("{}/module_{}_caller{}", o.callers.at(i), o.name, i);
}

expected<void> check_options(const remote_module_options& o) {
  if (o.name.empty() || o.name.find('/') != std::string::npos)
    return make_error(errc::invalid_argument, "remote module: name '{}' must be non-empty without '/'", o.name);
  if (o.callers.empty())
    return make_error(errc::invalid_argument, "remote module '{}': no callers", o.name);
  if (!o.factory || !o.optimizer)
    return make_error(errc::invalid_argument, "remote module '{}': a factory and an optimizer are required", o.name);
  if (o.callers.size() >= (1u << 16))
    return make_error(errc::invalid_argument, "remote module '{}': {} callers, at most 65535", o.name, o.callers.size());
  for (const auto& text : o.callers)
    if (auto p = actors::place::parse(text); !p)
      return make_error(errc::invalid_argument, "remote module '{}': caller place '{}': {}", o.name, text,
                        p.error().message());
  if (auto p = actors::place::parse(o.place); !p)
    return make_error(errc::invalid_argument, "remote module '{}': place '{}': {}", o.name, o.place,
                      p.error().message());
  return {};
}

// A call's context id: the caller in the top 16 bits, its call counter below.
std::uint32_t caller_of(std::uint64_t context) { return static_cast<std::uint32_t>(context >> 48); }

} // namespace

// -- the host actor -------------------------------------------------------------------------

struct remote_module_host::state {
  actors::node* node = nullptr;
  std::shared_ptr<actors::tensor_router> router;
  remote_module_options options;
  std::string place;
  device where = device::cpu(); ///< the place's device: the module's, its optimizer's
  trace::name_id trace_name; ///< the place's, for its receives and sends
  caf::actor handle;
  std::shared_ptr<nn::module> module;
  std::unique_ptr<optim::optimizer> optimizer;
  context_registry registry; // the host thread's only

  struct item {
    actors::tensor_message message;
    std::optional<std::uint32_t> lost_caller;
    std::string reason;
  };
  detail::mailbox_thread<item> mailbox;
  std::atomic<bool> stopped{false};
  std::uint64_t peer_lost_handler = 0;
  finish_hook at_finish;

  /// Stops the host thread and leaves the place (idempotent).
  void stop() {
    if (stopped.exchange(true))
      return;
    mailbox.stop();
    if (peer_lost_handler)
      node->remove_peer_lost_handler(peer_lost_handler);
    detail::detach_place(*node, place, handle);
  }

  // host thread; other threads read them under mailbox.state_mutex()
  std::uint64_t applied = 0;                          // last step applied
  std::map<std::uint64_t, std::set<std::uint32_t>> stepped; // step -> callers done
  std::map<std::uint64_t, std::vector<std::uint64_t>> contexts; // step -> forwards' contexts
  struct held {
    actors::tensor_message message;
    clock_type::time_point since;
  };
  std::deque<held> held_forwards;
  std::vector<std::optional<std::string>> lost;

  // checkpoints (remote_module_checkpoint.hpp)
  struct held_request {
    actors::tensor_message message;
    ps_wire::checkpoint_request request; ///< its directory points into message.value
    std::uint32_t caller = 0;
    clock_type::time_point since;
  };
  std::optional<held_request> held_save;
  struct staged_state {
    std::uint64_t checkpoint_step = 0;
    std::uint64_t module_step = 0;
    training_state_values values;
  };
  std::optional<staged_state> staged_load;
  /// Declared after the module: destroyed (its write finished) first.
  background_writer checkpoint_writer;

  void reply(std::uint32_t caller, message_kind kind, const actors::tensor_message& to, tensor value) {
    if (caller >= options.callers.size())
      return;
    (void)router->send(*actors::place::parse_named(caller_place(options, caller)),
                       make_message(kind, to.meta.step, 0, to.meta.context_id, std::move(value)), {}, trace_name);
  }

  void fail(std::uint32_t caller, const actors::tensor_message& to, const std::string& why) {
    fmt::print(stderr, "troupe: {}: {}\n", place, why);
    reply(caller, message_kind::control, to, ps_wire::encode_text(fmt::format("{}: {}", place, why)));
  }

  void reply_ok(std::uint32_t caller, const actors::tensor_message& to) {
    reply(caller, message_kind::parameters, to, ps_wire::encode_text("ok"));
  }

  void handle_item(item& i) {
    if (i.lost_caller)
      return caller_lost(*i.lost_caller, i.reason);
    actors::tensor_receive_scope traced(trace_name, i.message);
    try {
      handle_message(i.message);
    } catch (const std::exception& e) {
      fail(caller_of(i.message.meta.context_id), i.message, e.what());
    }
  }

  void handle_message(const actors::tensor_message& m) {
    const auto caller = caller_of(m.meta.context_id);
    if (caller >= options.callers.size()) {
      fmt::print(stderr, "troupe: {} dropped a message from caller {} of {}\n", place, caller, options.callers.size());
      return;
    }
    switch (m.meta.kind) {
      case message_kind::forward_activation:
        if (m.meta.step == 0)
          return fail(caller, m, "a forward for step 0 (steps start at 1)");
        if (m.meta.step > applied + 1) {
          if (auto why = lost_caller_reason())
            return fail(caller, m, *why);
          held_forwards.push_back({m, clock_type::now()});
          return;
        }
        if (m.meta.step <= applied)
          return fail(caller, m, fmt::format("a forward for step {}, which is already applied", m.meta.step));
        return forward(caller, m);
      case message_kind::backward_gradient: {
        const context_key key{m.meta.context_id, 0, 0};
        if (!registry.holds_sent(key))
          return fail(caller, m, fmt::format("a gradient for call {:#x}, which has no forward here", m.meta.context_id));
        registry.backward_sent(key, m.value.to(where));
        reply(caller, message_kind::backward_gradient, m, registry.take_received_grad(key));
        return;
      }
      case message_kind::control: // a step's end (float32) or a checkpoint request (uint8)
        if (m.value.type() == dtype::uint8)
          return handle_checkpoint(caller, m);
        return step_done(caller, m);
      default:
        return fail(caller, m, fmt::format("an unexpected {} message", name_of(m.meta.kind)));
    }
  }

  void forward(std::uint32_t caller, const actors::tensor_message& m) {
    const context_key key{m.meta.context_id, 0, 0};
    auto input = registry.receive(key, m.value.to(where), true);
    auto output = module->forward(input);
    registry.record_send(key, output);
    contexts[m.meta.step].push_back(m.meta.context_id);
    reply(caller, message_kind::forward_activation, m, output.data());
  }

  void step_done(std::uint32_t caller, const actors::tensor_message& m) {
    const auto step = m.meta.step;
    if (step <= applied || stepped[step].count(caller))
      return fail(caller, m, fmt::format("caller {} ended step {} twice", caller, step));
    stepped[step].insert(caller);
    while (stepped.count(applied + 1) && stepped[applied + 1].size() == options.callers.size()) {
      const auto done = applied + 1;
      if (options.average_over_callers && options.callers.size() > 1)
        for (auto& [name, p] : optimizer->parameters())
          if (p.grad().defined())
            p.grad().copy_from(mul(p.grad(), 1.0 / static_cast<double>(options.callers.size())));
      optimizer->step();
      optimizer->zero_grad();
      for (auto context : contexts[done]) // forwards that never got their backward
        registry.release_context(context);
      contexts.erase(done);
      stepped.erase(done);
      ++applied;
      try_save(); // before the next step can change the module
    }
    release_held_forwards();
  }

  /// Runs the held forwards that the steps applied so far allow.
  void release_held_forwards() {
    for (auto it = held_forwards.begin(); it != held_forwards.end();) {
      if (it->message.meta.step <= applied + 1) {
        forward(caller_of(it->message.meta.context_id), it->message);
        it = held_forwards.erase(it);
      } else {
        ++it;
      }
    }
  }

  // A request's directory and steps come from another process: the directory
  // is only opened or written under (a failure is the answer), a step past
  // the module's is refused.
  void handle_checkpoint(std::uint32_t caller, const actors::tensor_message& m) {
    auto decoded = ps_wire::decode(m.value);
    if (!decoded)
      return fail(caller, m, fmt::format("a malformed checkpoint request: {}", decoded.error().message()));
    const auto& r = decoded->checkpoint;
    switch (decoded->kind) {
      case ps_wire::op::save:
        if (held_save)
          return fail(caller, m, fmt::format("the save of step {} still waits; the save of step {} cannot start",
                                             held_save->request.table_step, r.table_step));
        held_save = held_request{m, r, caller, clock_type::now()};
        return try_save();
      case ps_wire::op::load: {
        auto reader = checkpoint_reader::open(std::filesystem::path(std::string(r.directory)));
        if (!reader)
          return fail(caller, m, reader.error().message());
        auto values = read_training_state(*reader, *module, *optimizer, state_names::of_part(options.name));
        if (!values)
          return fail(caller, m, values.error().message());
        staged_load = staged_state{r.checkpoint_step, r.table_step, std::move(*values)};
        return reply_ok(caller, m);
      }
      case ps_wire::op::apply_load:
        return apply_load(caller, m, r);
      default:
        return fail(caller, m, fmt::format("a checkpoint request of op {}, which a remote module does not serve",
                                           static_cast<int>(decoded->kind)));
    }
  }

  /// Saves the held request's step once the module has applied it.
  void try_save() {
    if (!held_save || applied < held_save->request.table_step)
      return;
    auto held = std::move(*held_save);
    held_save.reset();
    const auto& r = held.request;
    if (applied > r.table_step)
      return fail(held.caller, held.message,
                  fmt::format("remote module '{}' has applied step {}, past step {} being saved", options.name,
                              applied, r.table_step));
    // Asynchronous: copies now, on this thread, so the next step's update
    // cannot reach what is written.
    auto shares = training_shares(*module, *optimizer, {}, {}, r.asynchronous, state_names::of_part(options.name));
    auto write = [shares = std::move(shares), root = std::filesystem::path(std::string(r.directory)),
                  at = r.checkpoint_step, writer = remote_module_writer(options.name)] {
      return write_shares(root, at, writer, shares);
    };
    if (auto done = checkpoint_writer.write(std::move(write), r.asynchronous); !done)
      return fail(held.caller, held.message, done.error().message());
    reply_ok(held.caller, held.message);
  }

  void apply_load(std::uint32_t caller, const actors::tensor_message& m, const ps_wire::checkpoint_request& r) {
    if (!staged_load || staged_load->checkpoint_step != r.checkpoint_step || staged_load->module_step != r.table_step)
      return fail(caller, m, fmt::format("no load of checkpoint step {} was read", r.checkpoint_step));
    auto staged = std::move(*staged_load);
    staged_load.reset();
    if (auto ok = apply_training_state(std::move(staged.values), *module, *optimizer); !ok)
      return fail(caller, m, ok.error().message());
    optimizer->zero_grad();
    for (auto& [step, ids] : contexts)
      for (auto context : ids)
        registry.release_context(context);
    contexts.clear();
    stepped.clear();
    applied = staged.module_step;
    reply_ok(caller, m);
    release_held_forwards();
  }

  std::optional<std::string> lost_caller_reason() const {
    for (std::size_t c = 0; c < lost.size(); ++c)
      if (lost[c])
        return fmt::format("remote module '{}' waits for caller {} ({}), which was lost: {}", options.name, c,
                           options.callers[c], *lost[c]);
    return std::nullopt;
  }

  void caller_lost(std::uint32_t caller, const std::string& reason) {
    lost[caller] = reason;
    fmt::print(stderr, "troupe: {}: caller {} ({}) was lost: {}\n", place, caller, options.callers[caller], reason);
    for (auto& h : held_forwards)
      fail(caller_of(h.message.meta.context_id), h.message, *lost_caller_reason());
    held_forwards.clear();
    if (held_save) {
      fail(held_save->caller, held_save->message, *lost_caller_reason());
      held_save.reset();
    }
  }

  /// The callers that have not ended step applied + 1, named.
  std::string late_callers() {
    std::string missing;
    for (std::uint32_t c = 0; c < options.callers.size(); ++c)
      if (!stepped[applied + 1].count(c))
        missing += fmt::format("{}caller {} ({})", missing.empty() ? "" : ", ", c, options.callers[c]);
    return missing;
  }

  void expire_held() {
    auto now = clock_type::now();
    while (!held_forwards.empty() && now - held_forwards.front().since >= options.timeout) {
      auto& h = held_forwards.front();
      fail(caller_of(h.message.meta.context_id), h.message,
           fmt::format("a forward for step {} waited {} ms for step {} to end at {}", h.message.meta.step,
                       options.timeout.count(), applied + 1, late_callers()));
      held_forwards.pop_front();
    }
    if (held_save && now - held_save->since >= options.timeout) {
      fail(held_save->caller, held_save->message,
           fmt::format("the save of step {} waited {} ms for step {} to end at {}", held_save->request.table_step,
                       options.timeout.count(), applied + 1, late_callers()));
      held_save.reset();
    }
  }
};

expected<remote_module_host> remote_module_host::host(troupe::job& job, remote_module_options options) {
  auto made = host(job.node(), std::move(options));
  if (made)
    stop_at_finish(job, *made->state_);
  return made;
}

expected<remote_module_host> remote_module_host::host(actors::node& node, remote_module_options options) {
  if (auto ok = check_options(options); !ok)
    return ok.error();
  if (detail::node_of(options.place) != node.name())
    return make_error(errc::invalid_argument, "remote module '{}': its place {} is not on node {}", options.name,
                      options.place, node.name());
  auto st = std::make_shared<state>();
  st->node = &node;
  st->router = node.router();
  st->options = std::move(options);
  st->place = host_place(st->options);
  st->trace_name = trace::intern(st->place);
  st->module = st->options.factory();
  if (!st->module)
    return make_error(errc::invalid_argument, "remote module '{}': the factory built nothing", st->options.name);
  // The module, and so its optimizer's state, live on the place's device;
  // what arrives (on the host when it crossed processes) is moved there.
  st->where = actors::place::parse(st->options.place)->device;
  try {
    st->module->to(st->where);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, "remote module '{}': its place {}: {}", st->options.name,
                      st->options.place, e.what());
  }
  st->optimizer = st->options.optimizer(st->module->named_parameters());
  st->lost.resize(st->options.callers.size());
  remote_module_host host(st); // stops what started if joining fails
  auto* raw = st.get();
  auto handle =
      detail::attach_place(node, st->place, [raw](const actors::tensor_message& m) { raw->mailbox.post({m, {}, {}}); });
  if (!handle)
    return handle.error();
  st->handle = *handle;
  st->mailbox.start([raw](state::item& i) { raw->handle_item(i); }, [raw] { raw->expire_held(); });
  std::weak_ptr<state> weak = st;
  st->peer_lost_handler = node.on_peer_lost([weak](const actors::peer_lost& lost) {
    if (auto s = weak.lock())
      for (std::uint32_t c = 0; c < s->options.callers.size(); ++c)
        if (detail::node_of(s->options.callers[c]) == lost.node)
          s->mailbox.post({{}, c, fmt::format("node {} went away ({})", lost.node, lost.reason)});
  });
  std::vector<std::string> callers;
  for (std::uint32_t c = 0; c < st->options.callers.size(); ++c)
    callers.push_back(caller_place(st->options, c));
  if (auto ok = detail::await_places(node, callers, st->options.timeout); !ok)
    return ok.error();
  return host;
}

remote_module_host::~remote_module_host() { stop_now(state_); }
remote_module_host::remote_module_host(remote_module_host&&) noexcept = default;

remote_module_host& remote_module_host::operator=(remote_module_host&& other) noexcept {
  take_state(state_, other.state_);
  return *this;
}

void remote_module_host::stop() { state_->stop(); }

named_tensors remote_module_host::parameters() const {
  std::lock_guard lock(state_->mailbox.state_mutex());
  named_tensors out;
  for (auto& [name, p] : state_->module->named_parameters())
    out.emplace_back(name, host_copy(p.data(), /*snapshot=*/true));
  return out;
}

std::uint64_t remote_module_host::steps_applied() const {
  std::lock_guard lock(state_->mailbox.state_mutex());
  return state_->applied;
}

// -- the caller ---------------------------------------------------------------------------------

struct remote_module::state {
  std::shared_ptr<actors::tensor_router> router;
  remote_module_options options;
  std::uint32_t caller = 0;
  actors::place host;
  std::shared_ptr<detail::reply_endpoint> replies; // "<caller place>/module_<name>_caller<i>"

  std::mutex mutex; // step, next_call
  std::uint64_t step = 1;
  std::uint64_t next_call = 1;
  finish_hook at_finish;

  /// Unregisters the reply actor; later calls fail (idempotent).
  void stop() { replies->close(fmt::format("remote module '{}': the caller was shut down", options.name)); }

  /// A context no other call of this caller has: the caller's index in the
  /// top 16 bits, so the host can tell callers' calls apart.
  std::uint64_t next_context() {
    std::lock_guard lock(mutex);
    return (std::uint64_t{caller} << 48) | (next_call++ & ((std::uint64_t{1} << 48) - 1));
  }

  /// Sends `value` for call `context` and waits (bounded) for the host's answer.
  expected<tensor> request(message_kind kind, std::uint64_t step_of_call, std::uint64_t context, tensor value,
                           std::chrono::milliseconds timeout) {
    if (auto ok = replies->expect(context); !ok)
      return ok.error();
    auto sent = router->send(host, make_message(kind, step_of_call, 0, context, std::move(value)), {},
                             replies->trace_name());
    if (!sent) {
      replies->forget({context});
      return make_error(errc::io_error, "remote module '{}': sending to {} failed: {}", options.name,
                        host.to_string(), sent.error().message());
    }
    auto answer = replies->wait({context}, timeout,
                                fmt::format("remote module '{}' ({})", options.name, host.to_string()));
    if (!answer)
      return answer.error();
    return std::move(answer->front());
  }

  /// A forward or backward: as `request`, and a failure throws out of the
  /// autograd graph (data_parallel::backward returns it as its error).
  tensor call(message_kind kind, std::uint64_t step_of_call, std::uint64_t context, tensor value) {
    auto answer = request(kind, step_of_call, context, std::move(value), 2 * options.timeout);
    if (!answer)
      throw std::runtime_error(answer.error().message());
    return std::move(*answer);
  }
};

namespace {

/// Backward of a remote call: the output's gradient goes to the host, the
/// input's comes back and continues into the caller's graph.
class remote_call_backward final : public autograd::node {
public:
  remote_call_backward(std::shared_ptr<remote_module::state> st, std::uint64_t step, std::uint64_t context,
                       const autograd::variable& input)
      : state_(std::move(st)), step_(step), context_(context), input_device_(input.data().where()) {
    set_next_edges({autograd::gradient_edge(input)});
  }
  std::vector<tensor> apply(std::vector<tensor> grads) override {
    require(!released_, "remote_module_backward: already run");
    released_ = true;
    auto input_grad = state_->call(message_kind::backward_gradient, step_, context_, grads.at(0).contiguous());
    return {next_edges()[0].valid() ? input_grad.to(input_device_) : tensor{}};
  }
  std::string name() const override { return "remote_module_backward"; }

private:
  std::shared_ptr<remote_module::state> state_;
  std::uint64_t step_, context_;
  device input_device_; // where the input's gradient goes (the host's answer comes on the host)
  bool released_ = false;
};

} // namespace

expected<remote_module> remote_module::connect(troupe::job& job, remote_module_options options) {
  auto made = connect(job.node(), std::move(options));
  if (made)
    stop_at_finish(job, *made->state_);
  return made;
}

expected<remote_module> remote_module::connect(actors::node& node, remote_module_options options,
                                               std::int64_t caller) {
  if (auto ok = check_options(options); !ok)
    return ok.error();
  auto st = std::make_shared<state>();
  st->router = node.router();
  st->options = std::move(options);
  const auto& o = st->options;
  if (caller < 0) {
    auto mine = std::find_if(o.callers.begin(), o.callers.end(),
                             [&](auto& c) { return detail::node_of(c) == node.name(); });
    if (mine == o.callers.end())
      return make_error(errc::invalid_argument, "remote module '{}': no caller place is on node {}", o.name,
                        node.name());
    caller = mine - o.callers.begin();
  }
  if (caller >= static_cast<std::int64_t>(o.callers.size()) || detail::node_of(o.callers[caller]) != node.name())
    return make_error(errc::invalid_argument, "remote module '{}': caller {} is not placed on node {}", o.name, caller,
                      node.name());
  st->caller = static_cast<std::uint32_t>(caller);
  st->host = *actors::place::parse_named(host_place(o));
  auto endpoint = detail::reply_endpoint::open(node, caller_place(o, st->caller));
  if (!endpoint)
    return endpoint.error();
  st->replies = std::move(*endpoint);
  remote_module made(st);
  st->replies->fail_when_lost([name = o.name, where = o.place, host = st->host.to_string()](
                                  const actors::peer_lost& lost) -> std::optional<std::string> {
    if (detail::node_of(where) != lost.node)
      return std::nullopt;
    return fmt::format("remote module '{}' ({}) was lost: node {} went away ({})", name, host, lost.node, lost.reason);
  });
  if (auto ok = detail::await_places(node, {host_place(o)}, o.timeout); !ok)
    return ok.error();
  return made;
}

remote_module::~remote_module() { stop_now(state_); }
remote_module::remote_module(remote_module&&) noexcept = default;

remote_module& remote_module::operator=(remote_module&& other) noexcept {
  take_state(state_, other.state_);
  return *this;
}

void remote_module::shutdown() { state_->stop(); }

// -- checkpoints (remote_module_checkpoint.hpp) --------------------------------------------------

const remote_module_options& remote_module_access::options(const remote_module& module) {
  return module.state_->options;
}

std::uint32_t remote_module_access::caller(const remote_module& module) { return module.state_->caller; }

std::uint64_t remote_module_access::last_step(const remote_module& module) { return module.current_step() - 1; }

expected<void> remote_module_access::ask_host(remote_module& module, ps_wire::op kind,
                                              const ps_wire::checkpoint_request& request,
                                              std::chrono::milliseconds timeout) {
  auto& st = *module.state_;
  auto answer = st.request(message_kind::control, 0, st.next_context(), ps_wire::encode_checkpoint(kind, request),
                           timeout);
  if (!answer)
    return answer.error();
  return {};
}

void remote_module_access::continue_after(remote_module& module, std::uint64_t module_step) {
  std::lock_guard lock(module.state_->mutex);
  module.state_->step = module_step + 1;
}

std::uint64_t remote_module::current_step() const {
  std::lock_guard lock(state_->mutex);
  return state_->step;
}

autograd::variable remote_module::operator()(const autograd::variable& input) {
  auto& st = *state_;
  std::uint64_t step = 0;
  {
    std::lock_guard lock(st.mutex);
    step = st.step;
  }
  auto context = st.next_context();
  // The output on the input's device, wherever the host computed it.
  auto output = st.call(message_kind::forward_activation, step, context, input.data().contiguous())
                  .to(input.data().where());
  auto fn = std::make_shared<remote_call_backward>(state_, step, context, input);
  return autograd::variable::make_result(std::move(output), std::move(fn));
}

expected<void> remote_module::step() {
  auto& st = *state_;
  std::uint64_t step = 0;
  if (auto failed = st.replies->failure())
    return make_error(errc::io_error, "{}", *failed);
  {
    std::lock_guard lock(st.mutex);
    step = st.step++;
  }
  auto sent = st.router->send(st.host,
                              make_message(message_kind::control, step, 0, std::uint64_t{st.caller} << 48,
                                           tensor::zeros({1})),
                              {}, st.replies->trace_name());
  if (!sent)
    return make_error(errc::io_error, "remote module '{}': ending step {} at {} failed: {}", st.options.name, step,
                      st.host.to_string(), sent.error().message());
  return {};
}

} // namespace troupe::parallel
