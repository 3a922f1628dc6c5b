#include "troupe/parallel/parameter_server.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "troupe/actors/node.hpp"
#include "troupe/actors/place.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/node.hpp"
#include "troupe/job.hpp"
#include "troupe/tensor/error.hpp"

#include "actor_places.hpp"
#include "finish_hook.hpp"
#include "mailbox_thread.hpp"
#include "reply_endpoint.hpp"
#include "ps_checkpoint.hpp"
#include "ps_shard.hpp"
#include "ps_wire.hpp"

namespace troupe::parallel {

using namespace std::chrono_literals;
using detail::attach_place;
using detail::await_places;
using detail::detach_place;
using detail::node_of;
using detail::outgoing_tensor;
using clock_type = std::chrono::steady_clock;

namespace {

std::string shard_place(const parameter_server_options& o, std::uint32_t k) {
  return fmt::format("{}/ps{}", o.servers.at(k), k);
}

std::string client_place(const parameter_server_options& o, std::uint32_t i) {
  return fmt::format("{}/ps_client{}", o.trainers.at(i), i);
}

expected<void> check_options(const parameter_server_options& o) {
  if (o.tables.empty())
    return make_error(errc::invalid_argument, "parameter server: no tables");
  if (o.servers.empty() || o.trainers.empty())
    return make_error(errc::invalid_argument, "parameter server: {} servers and {} trainers; both must be at least 1",
                      o.servers.size(), o.trainers.size());
  if (o.tables.size() > 65535)
    return make_error(errc::invalid_argument, "parameter server: {} tables, at most 65535", o.tables.size());
  for (std::size_t t = 0; t < o.tables.size(); ++t) {
    const auto& spec = o.tables[t];
    if (spec.name.empty())
      return make_error(errc::invalid_argument, "parameter server: table {} has no name", t);
    for (std::size_t u = 0; u < t; ++u)
      if (o.tables[u].name == spec.name)
        return make_error(errc::invalid_argument, "parameter server: two tables are named '{}'", spec.name);
    if (spec.rows <= 0 || spec.dim <= 0 || spec.dim > (1 << 24))
      return make_error(errc::invalid_argument, "parameter server: table '{}' is {} x {}; rows must be positive and dim in [1, 2^24]",
                        spec.name, spec.rows, spec.dim);
    if (!(spec.optimizer.lr > 0))
      return make_error(errc::invalid_argument, "parameter server: table '{}' has learning rate {}", spec.name,
                        spec.optimizer.lr);
  }
  for (const auto& text : o.servers)
    if (auto p = actors::place::parse(text); !p)
      return make_error(errc::invalid_argument, "parameter server: server place '{}': {}", text, p.error().message());
  for (const auto& text : o.trainers)
    if (auto p = actors::place::parse(text); !p)
      return make_error(errc::invalid_argument, "parameter server: trainer place '{}': {}", text, p.error().message());
  return {};
}

} // namespace

// -- the server shard actor -----------------------------------------------------------------

/// One shard: a thread owning its rows, fed through a queue by the router.
struct shard_actor {
  struct item {
    actors::tensor_message message;
    std::optional<std::uint32_t> lost_trainer; // instead of a message
    std::string lost_reason;
  };
  struct waiting_lookup {
    actors::tensor_message message;
    ps_wire::lookup_request request; // decoded on arrival; points into message.value
    clock_type::time_point since;
  };
  struct received_rows {
    tensor bytes;
    ps_wire::gradients_request rows; // decoded on arrival; points into bytes
  };
  struct table_state {
    std::uint64_t applied = 0;                    // synchronous: the last step applied
    std::vector<std::uint64_t> applied_by;        // per trainer: its last step applied
    std::map<std::uint64_t, std::vector<std::optional<received_rows>>> pending; // synchronous: step -> per trainer
    std::deque<waiting_lookup> waiting;
  };

  const parameter_server_options& options;
  std::uint32_t index;
  std::string place;
  trace::name_id trace_name; ///< the place's, for its receives and sends
  std::shared_ptr<actors::tensor_router> router;
  std::vector<table_shard> tables;
  std::vector<table_state> states;
  std::vector<std::optional<std::string>> lost; // per trainer: why it was lost

  /// A checkpoint request the shard holds until it can answer it.
  struct held_request {
    actors::tensor_message message;
    ps_wire::checkpoint_request request; // decoded on arrival; its directory points into message.value
    clock_type::time_point since;
  };
  /// A save waits until every synchronous table has applied its step.
  std::optional<held_request> held_save;
  /// Trainers' waits for a load (await_load) not yet applied.
  std::vector<held_request> awaiting_load;
  /// A load read but not yet applied (every shard reads before any applies).
  struct staged_state {
    std::uint64_t checkpoint_step = 0;
    std::uint64_t table_step = 0;
    std::vector<table_shard_state> tables;
  };
  std::optional<staged_state> staged_load;
  /// The tables' step of the last load applied.
  std::optional<std::uint64_t> loaded_step;

  parameter_server_stats stats; // the thread's; others read it under mailbox.state_mutex()
  detail::mailbox_thread<item> mailbox;
  caf::actor handle;
  /// Writes this shard's checkpoint files; declared last, so destroyed
  /// (its write finished) first.
  background_writer checkpoint_writer;

  shard_actor(const parameter_server_options& o, std::uint32_t k, std::shared_ptr<actors::tensor_router> r)
      : options(o), index(k), place(shard_place(o, k)), trace_name(trace::intern(place)), router(std::move(r)),
        lost(o.trainers.size()) {
    for (const auto& spec : o.tables) {
      tables.emplace_back(spec, k, static_cast<std::uint32_t>(o.servers.size()));
      table_state s;
      s.applied_by.assign(o.trainers.size(), 0);
      states.push_back(std::move(s));
      stats.table_bytes += tables.back().table_bytes();
      stats.state_bytes += tables.back().state_bytes();
    }
  }

  /// The thread first: it may still be handing the writer a save.
  ~shard_actor() { mailbox.stop(); }

  void start() {
    mailbox.start(
        [this](item& i) {
          if (i.lost_trainer) {
            trainer_lost(*i.lost_trainer, i.lost_reason);
            return;
          }
          actors::tensor_receive_scope traced(trace_name, i.message);
          handle_message(i.message);
        },
        [this] {
          expire_waiting();
          expire_checkpoint_requests();
        });
  }

  void send_ok(std::uint32_t trainer, const actors::tensor_message& request) {
    (void)router->send(*actors::place::parse_named(client_place(options, trainer)),
                       detail::make_message(message_kind::parameters, request.meta.step, index,
                                            request.meta.context_id, ps_wire::encode_text("ok")),
                       {}, trace_name);
  }

  void send_error(std::uint32_t trainer, const actors::tensor_message& request, const std::string& why) {
    ++stats.rejected;
    if (trainer >= options.trainers.size())
      return;
    (void)router->send(*actors::place::parse_named(client_place(options, trainer)),
                       detail::make_message(message_kind::control, request.meta.step, index, request.meta.context_id,
                                            ps_wire::encode_text(fmt::format("{}: {}", place, why))),
                       {}, trace_name);
  }

  void handle_message(const actors::tensor_message& m) {
    auto decoded = ps_wire::decode(m.value);
    if (!decoded) {
      ++stats.rejected;
      fmt::print(stderr, "troupe: {} dropped a request: {}\n", place, decoded.error().message());
      return;
    }
    const auto& r = *decoded;
    const bool checkpoint = r.kind != ps_wire::op::lookup && r.kind != ps_wire::op::gradients;
    const auto trainer = checkpoint                       ? r.checkpoint.trainer
                         : r.kind == ps_wire::op::lookup ? r.lookup.trainer
                                                         : r.gradients.trainer;
    const auto table = r.kind == ps_wire::op::lookup ? r.lookup.table : r.gradients.table;
    if (trainer >= options.trainers.size()) {
      ++stats.rejected;
      fmt::print(stderr, "troupe: {} dropped a request from trainer {} of {}\n", place, trainer, options.trainers.size());
      return;
    }
    if (checkpoint)
      return handle_checkpoint(m, r.kind, r.checkpoint);
    if (table >= tables.size())
      return send_error(trainer, m, fmt::format("table {} does not exist ({} tables)", table, tables.size()));
    if (m.meta.step == 0)
      return send_error(trainer, m, "step 0 (steps start at 1)");
    if (r.kind == ps_wire::op::lookup) {
      if (auto ok = tables[table].check_ids(r.lookup.ids); !ok)
        return send_error(trainer, m, ok.error().message());
      if (lookup_may_run(table, m.meta.step))
        answer_lookup(m, r.lookup);
      else if (auto why = blocked_by_lost_trainer(table); why)
        send_error(trainer, m, *why);
      else
        states[table].waiting.push_back({m, r.lookup, clock_type::now()});
      return;
    }
    receive_gradients(m, r.gradients);
  }

  /// Whether a lookup for `step` may see the table now (its consistency).
  bool lookup_may_run(std::uint16_t table, std::uint64_t step) const {
    const auto& spec = tables[table].spec();
    const auto& s = states[table];
    switch (spec.consistency.type) {
      case consistency::kind::asynchronous:
        return true;
      case consistency::kind::synchronous:
        return step <= s.applied + 1;
      case consistency::kind::bounded: {
        auto slowest = *std::min_element(s.applied_by.begin(), s.applied_by.end());
        return step <= slowest + 1 + spec.consistency.staleness;
      }
    }
    return true;
  }

  std::optional<std::string> blocked_by_lost_trainer(std::uint16_t table) const {
    if (tables[table].spec().consistency.type == consistency::kind::asynchronous)
      return std::nullopt;
    for (std::size_t t = 0; t < lost.size(); ++t)
      if (lost[t])
        return fmt::format("table '{}' waits for trainer {} ({}), which was lost: {}", tables[table].spec().name, t,
                           options.trainers[t], *lost[t]);
    return std::nullopt;
  }

  void answer_lookup(const actors::tensor_message& m, const ps_wire::lookup_request& r) {
    const auto& shard = tables[r.table];
    auto out = outgoing_tensor(*router, {static_cast<std::int64_t>(r.offsets.size()), shard.dim()}, dtype::float32);
    std::memset(out.raw_data(), 0, static_cast<std::size_t>(out.numel()) * sizeof(float));
    shard.pool(r.offsets, r.ids, r.weights, out.data<float>());
    ++stats.lookups;
    stats.ids_looked_up += r.ids.size();
    (void)router->send(*actors::place::parse_named(client_place(options, r.trainer)),
                       detail::make_message(message_kind::parameters, m.meta.step, index, m.meta.context_id, std::move(out)),
                       {}, trace_name);
  }

  void receive_gradients(const actors::tensor_message& m, const ps_wire::gradients_request& r) {
    auto& shard = tables[r.table];
    auto& s = states[r.table];
    const auto& spec = shard.spec();
    if (r.dim != shard.dim())
      return send_error(r.trainer, m, fmt::format("table '{}': gradient rows of width {}, the table's is {}", spec.name,
                                                  r.dim, shard.dim()));
    if (auto ok = shard.check_ids(r.ids); !ok)
      return send_error(r.trainer, m, ok.error().message());
    for (std::size_t i = 1; i < r.ids.size(); ++i)
      if (r.ids[i] <= r.ids[i - 1])
        return send_error(r.trainer, m, fmt::format("table '{}': gradient ids must increase (coalesced), but id {} "
                                                    "follows {} at position {}",
                                                    spec.name, r.ids[i], r.ids[i - 1], i));
    const auto step = m.meta.step;
    if (step <= s.applied_by[r.trainer])
      return send_error(r.trainer, m, fmt::format("table '{}': trainer {} sent step {} again (its last was {})",
                                                  spec.name, r.trainer, step, s.applied_by[r.trainer]));
    ++stats.gradient_pushes;
    const float scale = spec.average_over_trainers ? 1.0f / static_cast<float>(options.trainers.size()) : 1.0f;
    if (spec.consistency.type == consistency::kind::synchronous) {
      auto& slots = s.pending[step];
      slots.resize(options.trainers.size());
      slots[r.trainer] = received_rows{m.value, r};
      s.applied_by[r.trainer] = step;
      apply_complete_steps(r.table, scale);
      try_save(); // the state of a step being saved is complete now, and no later step is applied
    } else {
      shard.apply(r.ids, r.rows.data(), scale);
      s.applied_by[r.trainer] = step;
      ++stats.updates_applied;
      stats.rows_updated += r.ids.size();
    }
    serve_waiting(r.table);
  }

  /// Synchronous: applies every step for which all trainers' rows are in,
  /// in step order, summing the trainers' rows of each id (in trainer order).
  void apply_complete_steps(std::uint16_t table, float scale) {
    auto& s = states[table];
    auto& shard = tables[table];
    const auto dim = shard.dim();
    for (;;) {
      auto it = s.pending.find(s.applied + 1);
      if (it == s.pending.end())
        return;
      auto& slots = it->second;
      if (std::any_of(slots.begin(), slots.end(), [](const auto& slot) { return !slot.has_value(); }))
        return;
      std::vector<ps_wire::gradients_request> parts;
      std::size_t total = 0;
      for (auto& slot : slots) {
        parts.push_back(slot->rows);
        total += parts.back().ids.size();
      }
      // Merge the sorted id lists; equal ids are summed in trainer order.
      std::vector<std::int64_t> ids;
      std::vector<float> rows;
      ids.reserve(total);
      rows.reserve(total * static_cast<std::size_t>(dim));
      std::vector<std::size_t> at(parts.size(), 0);
      for (;;) {
        std::int64_t next = -1;
        for (std::size_t p = 0; p < parts.size(); ++p)
          if (at[p] < parts[p].ids.size() && (next < 0 || parts[p].ids[at[p]] < next))
            next = parts[p].ids[at[p]];
        if (next < 0)
          break;
        ids.push_back(next);
        rows.resize(rows.size() + static_cast<std::size_t>(dim), 0.0f);
        float* row = rows.data() + rows.size() - static_cast<std::size_t>(dim);
        for (std::size_t p = 0; p < parts.size(); ++p)
          if (at[p] < parts[p].ids.size() && parts[p].ids[at[p]] == next) {
            const float* g = parts[p].rows.data() + at[p] * static_cast<std::size_t>(dim);
            for (std::int64_t c = 0; c < dim; ++c)
              row[c] += g[c];
            ++at[p];
          }
      }
      shard.apply(ids, rows.data(), scale);
      ++s.applied;
      s.pending.erase(it);
      ++stats.updates_applied;
      stats.rows_updated += ids.size();
    }
  }

  void serve_waiting(std::uint16_t table) {
    auto& waiting = states[table].waiting;
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (lookup_may_run(table, it->message.meta.step)) {
        answer_lookup(it->message, it->request);
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// A waiting lookup is never kept longer than the timeout: it fails naming
  /// the trainers whose gradients are missing.
  void expire_waiting() {
    auto now = clock_type::now();
    for (std::uint16_t t = 0; t < states.size(); ++t) {
      auto& waiting = states[t].waiting;
      while (!waiting.empty() && now - waiting.front().since >= options.timeout) {
        auto& w = waiting.front();
        std::string missing;
        const auto need = w.message.meta.step - 1 -
                          (tables[t].spec().consistency.type == consistency::kind::bounded
                               ? std::min<std::uint64_t>(w.message.meta.step - 1, tables[t].spec().consistency.staleness)
                               : 0);
        for (std::size_t k = 0; k < options.trainers.size(); ++k)
          if (states[t].applied_by[k] < need)
            missing += fmt::format("{}trainer {} ({}, at step {})", missing.empty() ? "" : ", ", k, options.trainers[k],
                                   states[t].applied_by[k]);
        auto trainer = w.request.trainer;
        send_error(trainer, w.message,
                   fmt::format("table '{}': a lookup for step {} waited {} ms for step {}'s gradients from {}",
                               tables[t].spec().name, w.message.meta.step, options.timeout.count(), need,
                               missing.empty() ? "(none missing)" : missing));
        waiting.pop_front();
      }
    }
  }

  void trainer_lost(std::uint32_t trainer, const std::string& reason) {
    lost[trainer] = reason;
    fmt::print(stderr, "troupe: {}: trainer {} ({}) was lost: {}; lookups that wait for it fail\n", place, trainer,
               options.trainers[trainer], reason);
    if (held_save) {
      send_error(held_save->request.trainer, held_save->message,
                 fmt::format("the save of step {} waits for trainer {} ({}), which was lost: {}",
                             held_save->request.table_step, trainer, options.trainers[trainer], reason));
      held_save.reset();
    }
    for (std::uint16_t t = 0; t < states.size(); ++t) {
      auto why = blocked_by_lost_trainer(t);
      if (!why)
        continue;
      for (auto& w : states[t].waiting)
        send_error(w.request.trainer, w.message, *why);
      states[t].waiting.clear();
    }
  }

  // -- checkpoints (ps_checkpoint.hpp; docs/design.md, "Saving and resuming a job") --
  //
  // save(step t): the shard copies every table's rows and optimizer state
  // once each synchronous table has applied exactly step t, answers, and
  // writes the copy as its shard of the checkpoint (on its writer thread
  // when asynchronous). The saving trainer does not push step t + 1 before
  // the answer, so no synchronous table can move past t meanwhile; rows of
  // later steps other trainers pushed stay pending and are not saved (they
  // redo those steps after a resume). Asynchronous and bounded tables are
  // copied as they stand when the request arrives.
  // load(directory): every table's rows for this shard are read (any saved
  // sharding) and staged; apply_load puts them in place and makes step t
  // the last applied, so the whole server changes only once every shard has
  // read its part. await_load(t) is answered once a load of step t applied:
  // a trainer that resumed waits for it before its first lookup.

  void handle_checkpoint(const actors::tensor_message& m, ps_wire::op kind, const ps_wire::checkpoint_request& r) {
    switch (kind) {
      case ps_wire::op::save:
        if (held_save)
          return send_error(r.trainer, m, fmt::format("the save of step {} is still waiting; step {} cannot start",
                                                      held_save->request.table_step, r.table_step));
        held_save = held_request{m, r, clock_type::now()};
        return try_save();
      case ps_wire::op::load: {
        const std::filesystem::path directory(std::string(r.directory));
        auto reader = checkpoint_reader::open(directory);
        if (!reader)
          return send_error(r.trainer, m, reader.error().message());
        auto values = read_parameter_server_shard(*reader, options, index);
        if (!values)
          return send_error(r.trainer, m, values.error().message());
        staged_load = staged_state{r.checkpoint_step, r.table_step, std::move(*values)};
        return send_ok(r.trainer, m);
      }
      case ps_wire::op::apply_load:
        if (!staged_load || staged_load->checkpoint_step != r.checkpoint_step || staged_load->table_step != r.table_step)
          return send_error(r.trainer, m, fmt::format("no load of checkpoint step {} was read", r.checkpoint_step));
        apply_staged_load();
        return send_ok(r.trainer, m);
      case ps_wire::op::await_load:
        if (loaded_step == r.table_step)
          return send_ok(r.trainer, m);
        awaiting_load.push_back({m, r, clock_type::now()});
        return;
      default:
        return send_error(r.trainer, m, fmt::format("unknown checkpoint request {}", static_cast<int>(kind)));
    }
  }

  /// Saves the held request's step if every synchronous table is at it.
  void try_save() {
    if (!held_save)
      return;
    const auto step = held_save->request.table_step;
    for (std::uint16_t t = 0; t < tables.size(); ++t) {
      if (tables[t].spec().consistency.type != consistency::kind::synchronous)
        continue;
      if (states[t].applied > step) {
        send_error(held_save->request.trainer, held_save->message,
                   fmt::format("table '{}' has applied step {}, past step {} being saved", tables[t].spec().name,
                               states[t].applied, step));
        held_save.reset();
        return;
      }
      if (states[t].applied < step)
        return; // the trainers' gradients for it are still coming
    }
    auto held = std::move(*held_save);
    held_save.reset();
    std::vector<table_shard_state> copies;
    for (const auto& table : tables)
      copies.push_back(table.copy_state());
    const auto& r = held.request;
    auto shares = parameter_server_shares(options, r.server, index, std::move(copies));
    auto write = [shares = std::move(shares), root = std::filesystem::path(std::string(r.directory)),
                  at = r.checkpoint_step, writer = parameter_server_writer(r.server, index)]() {
      return write_shares(root, at, writer, shares);
    };
    if (auto done = checkpoint_writer.write(std::move(write), r.asynchronous); !done)
      return send_error(r.trainer, held.message, done.error().message());
    send_ok(r.trainer, held.message);
  }

  void apply_staged_load() {
    const auto step = staged_load->table_step;
    for (std::uint16_t t = 0; t < tables.size(); ++t) {
      tables[t].restore(staged_load->tables[t]);
      auto& s = states[t];
      s.applied = step;
      for (auto& applied : s.applied_by)
        applied = std::max(applied, step);
      s.pending.erase(s.pending.begin(), s.pending.upper_bound(step));
    }
    staged_load.reset();
    loaded_step = step;
    for (auto& w : awaiting_load) {
      if (w.request.table_step == step)
        send_ok(w.request.trainer, w.message);
      else
        send_error(w.request.trainer, w.message,
                   fmt::format("it waits for a load of step {}, but step {} was loaded", w.request.table_step, step));
    }
    awaiting_load.clear();
    for (std::uint16_t t = 0; t < tables.size(); ++t)
      serve_waiting(t);
  }

  /// A held save or a wait for a load fails after the timeout, naming what
  /// it waited for.
  void expire_checkpoint_requests() {
    const auto now = clock_type::now();
    if (held_save && now - held_save->since >= options.timeout) {
      std::string behind;
      for (std::uint16_t t = 0; t < tables.size(); ++t)
        if (tables[t].spec().consistency.type == consistency::kind::synchronous &&
            states[t].applied < held_save->request.table_step)
          for (std::size_t k = 0; k < options.trainers.size(); ++k)
            if (states[t].applied_by[k] < held_save->request.table_step)
              behind += fmt::format("{}table '{}': trainer {} ({}) at step {}", behind.empty() ? "" : ", ",
                                    tables[t].spec().name, k, options.trainers[k], states[t].applied_by[k]);
      send_error(held_save->request.trainer, held_save->message,
                 fmt::format("the save of step {} waited {} ms for the trainers' gradients: {}",
                             held_save->request.table_step, options.timeout.count(),
                             behind.empty() ? "(none missing)" : behind));
      held_save.reset();
    }
    std::erase_if(awaiting_load, [&](const held_request& w) {
      if (now - w.since < options.timeout)
        return false;
      send_error(w.request.trainer, w.message,
                 fmt::format("no load of step {} within {} ms", w.request.table_step, options.timeout.count()));
      return true;
    });
  }
};

struct parameter_server::state {
  actors::node* node = nullptr;
  parameter_server_options options;
  std::vector<std::unique_ptr<shard_actor>> shards;
  std::uint64_t peer_lost_handler = 0;
  bool stopped = false;
  finish_hook at_finish;

  void stop() {
    if (stopped)
      return;
    stopped = true;
    if (peer_lost_handler)
      node->remove_peer_lost_handler(peer_lost_handler);
    for (auto& shard : shards) {
      detach_place(*node, shard->place, shard->handle);
      shard->mailbox.stop();
    }
  }
};

expected<parameter_server> parameter_server::host(troupe::job& job, parameter_server_options options) {
  auto made = host(job.node(), std::move(options));
  if (made)
    stop_at_finish(job, *made->state_);
  return made;
}

expected<parameter_server> parameter_server::host(actors::node& node, parameter_server_options options) {
  if (auto ok = check_options(options); !ok)
    return ok.error();
  auto st = std::make_shared<state>();
  st->node = &node;
  st->options = std::move(options);
  parameter_server server(st); // stops what started if joining fails
  const auto& o = st->options;
  for (std::uint32_t k = 0; k < o.servers.size(); ++k) {
    if (node_of(o.servers[k]) != node.name())
      continue;
    auto shard = std::make_unique<shard_actor>(o, k, node.router());
    auto* raw = shard.get();
    auto handle =
        attach_place(node, raw->place, [raw](const actors::tensor_message& m) { raw->mailbox.post({m, {}, {}}); });
    if (!handle)
      return handle.error();
    raw->handle = *handle;
    raw->start();
    st->shards.push_back(std::move(shard));
  }
  if (st->shards.empty())
    return make_error(errc::invalid_argument, "parameter server: no server place is on node {}", node.name());
  std::weak_ptr<state> weak = st;
  st->peer_lost_handler = node.on_peer_lost([weak](const actors::peer_lost& lost) {
    auto s = weak.lock();
    if (!s)
      return;
    for (std::uint32_t t = 0; t < s->options.trainers.size(); ++t)
      if (node_of(s->options.trainers[t]) == lost.node)
        for (auto& shard : s->shards)
          shard->mailbox.post({{}, t, fmt::format("node {} went away ({})", lost.node, lost.reason)});
  });
  std::vector<std::string> clients;
  for (std::uint32_t i = 0; i < o.trainers.size(); ++i)
    clients.push_back(client_place(o, i));
  if (auto ok = await_places(node, clients, o.timeout); !ok)
    return ok.error();
  return server;
}

parameter_server::~parameter_server() { stop_now(state_); }
parameter_server::parameter_server(parameter_server&&) noexcept = default;

parameter_server& parameter_server::operator=(parameter_server&& other) noexcept {
  take_state(state_, other.state_);
  return *this;
}

void parameter_server::stop() { state_->stop(); }

parameter_server_stats parameter_server::stats() const {
  parameter_server_stats total;
  for (auto& shard : state_->shards) {
    std::lock_guard lock(shard->mailbox.state_mutex());
    const auto& s = shard->stats;
    total.lookups += s.lookups;
    total.ids_looked_up += s.ids_looked_up;
    total.gradient_pushes += s.gradient_pushes;
    total.rows_updated += s.rows_updated;
    total.updates_applied += s.updates_applied;
    total.rejected += s.rejected;
    total.table_bytes += s.table_bytes;
    total.state_bytes += s.state_bytes;
  }
  return total;
}

expected<tensor> parameter_server::read_rows(const std::string& table, std::int64_t first, std::int64_t count) const {
  const auto& o = state_->options;
  for (std::size_t t = 0; t < o.tables.size(); ++t) {
    if (o.tables[t].name != table)
      continue;
    shard_map map{o.tables[t].rows, static_cast<std::uint32_t>(o.servers.size()), o.tables[t].shard_by};
    if (first < 0 || count < 0 || first + count > o.tables[t].rows)
      return make_error(errc::invalid_argument, "table '{}': rows [{}, {}) are outside [0, {})", table, first,
                        first + count, o.tables[t].rows);
    auto out = tensor::empty({count, o.tables[t].dim});
    for (std::int64_t i = 0; i < count; ++i) {
      auto k = map.shard_of(first + i);
      auto it = std::find_if(state_->shards.begin(), state_->shards.end(), [&](auto& s) { return s->index == k; });
      if (it == state_->shards.end())
        return make_error(errc::invalid_argument, "table '{}': row {} is on shard {}, not on this node", table,
                          first + i, k);
      // The shard's thread writes rows: stop it from doing so meanwhile.
      std::lock_guard lock((*it)->mailbox.state_mutex());
      auto row = (*it)->tables[t].read(first + i, 1);
      if (!row)
        return row.error();
      std::memcpy(out.data<float>() + i * o.tables[t].dim, row->raw_data(),
                  static_cast<std::size_t>(o.tables[t].dim) * sizeof(float));
    }
    return out;
  }
  return make_error(errc::invalid_argument, "parameter server: no table '{}'", table);
}

// -- the trainer's client -----------------------------------------------------------------------

struct parameter_client::state {
  actors::node* node = nullptr;
  std::shared_ptr<actors::tensor_router> router;
  parameter_server_options options;
  std::uint32_t trainer = 0;
  /// The trainer place's device: lookups and pulls answer there, gradients
  /// may come from there (the shards keep their rows in host memory).
  device where = device::cpu();
  std::shared_ptr<detail::reply_endpoint> replies; // "<trainer place>/ps_client<i>"
  std::vector<shard_map> maps;
  std::vector<actors::place> shard_places;

  std::mutex mutex; // next_request, step, gradients
  std::uint64_t next_request = 1;
  std::uint64_t step = 1;

  /// This step's gradient rows per table, coalesced as they are recorded.
  struct accumulated {
    std::unordered_map<std::int64_t, std::size_t> slot; // id -> row index
    std::vector<std::int64_t> ids;
    std::vector<float> rows;
  };
  std::vector<accumulated> gradients;

  expected<std::uint16_t> table_index(const std::string& name) const {
    for (std::size_t t = 0; t < options.tables.size(); ++t)
      if (options.tables[t].name == name)
        return static_cast<std::uint16_t>(t);
    return make_error(errc::invalid_argument, "parameter client: no table '{}'", name);
  }

  finish_hook at_finish;
  /// Later calls fail (idempotent).
  void stop() { replies->close("the parameter client was shut down"); }
};

// The client's work on its state, shared by its methods and by the
// embedding modules and their backward (which keep the state, not the
// client object, so the client may move).
static expected<tensor> lookup_rows(parameter_client::state& st, const std::string& table, const tensor& ids,
                                    const tensor& offsets, bag_mode mode, const tensor& weights);
static expected<void> record_rows(parameter_client::state& st, const std::string& table, const tensor& ids,
                                  const tensor& offsets, bag_mode mode, const tensor& weights, const tensor& grad);

namespace {

/// Checks a lookup's ids, offsets and weights against the table.
expected<void> check_bags(const table_spec& spec, const tensor& ids, const tensor& offsets, const tensor& weights) {
  if (!ids.defined() || ids.type() != dtype::int64 || ids.rank() != 1)
    return make_error(errc::invalid_argument, "table '{}': ids must be an int64 vector, got {}", spec.name,
                      ids.defined() ? fmt::format("{} {}", ids.type(), ids.shape()) : std::string("nothing"));
  if (!offsets.defined() || offsets.type() != dtype::int64 || offsets.rank() != 1)
    return make_error(errc::invalid_argument, "table '{}': offsets must be an int64 vector", spec.name);
  if (weights.defined() && (weights.type() != dtype::float32 || weights.shape() != ids.shape()))
    return make_error(errc::invalid_argument, "table '{}': per-sample weights must be float32 {}, got {} {}",
                      spec.name, ids.shape(), weights.type(), weights.shape());
  const auto* id = ids.data<std::int64_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    if (id[i] < 0 || id[i] >= spec.rows)
      return make_error(errc::invalid_argument, "table '{}': ids[{}] = {} is outside [0, {})", spec.name, i, id[i],
                        spec.rows);
  const auto* off = offsets.data<std::int64_t>();
  if (offsets.numel() == 0 && ids.numel() != 0)
    return make_error(errc::invalid_argument, "table '{}': {} ids but no offsets", spec.name, ids.numel());
  for (std::int64_t b = 0; b < offsets.numel(); ++b) {
    if (b == 0 && off[0] != 0)
      return make_error(errc::invalid_argument, "table '{}': offsets[0] is {}, not 0", spec.name, off[0]);
    if (b > 0 && off[b] < off[b - 1])
      return make_error(errc::invalid_argument, "table '{}': offsets[{}] = {} is below offsets[{}] = {}", spec.name, b,
                        off[b], b - 1, off[b - 1]);
    if (off[b] > ids.numel())
      return make_error(errc::invalid_argument, "table '{}': offsets[{}] = {} is past the {} ids", spec.name, b, off[b],
                        ids.numel());
  }
  return {};
}

} // namespace

expected<parameter_client> parameter_client::connect(troupe::job& job, parameter_server_options options) {
  auto made = connect(job.node(), std::move(options));
  if (made)
    stop_at_finish(job, *made->state_);
  return made;
}

expected<parameter_client> parameter_client::connect(actors::node& node, parameter_server_options options,
                                                     std::int64_t trainer) {
  if (auto ok = check_options(options); !ok)
    return ok.error();
  auto st = std::make_shared<state>();
  st->node = &node;
  st->router = node.router();
  st->options = std::move(options);
  const auto& o = st->options;
  if (trainer < 0) {
    auto mine = std::find_if(o.trainers.begin(), o.trainers.end(), [&](auto& t) { return node_of(t) == node.name(); });
    if (mine == o.trainers.end())
      return make_error(errc::invalid_argument, "parameter client: no trainer place is on node {}", node.name());
    trainer = mine - o.trainers.begin();
  }
  if (trainer >= static_cast<std::int64_t>(o.trainers.size()) || node_of(o.trainers[trainer]) != node.name())
    return make_error(errc::invalid_argument, "parameter client: trainer {} is not placed on node {}", trainer,
                      node.name());
  st->trainer = static_cast<std::uint32_t>(trainer);
  if (auto mine = actors::place::parse(o.trainers[st->trainer]))
    st->where = mine->device;
  for (const auto& spec : o.tables)
    st->maps.push_back({spec.rows, static_cast<std::uint32_t>(o.servers.size()), spec.shard_by});
  st->gradients.resize(o.tables.size());
  std::vector<std::string> shards;
  for (std::uint32_t k = 0; k < o.servers.size(); ++k) {
    shards.push_back(shard_place(o, k));
    st->shard_places.push_back(*actors::place::parse_named(shards.back()));
  }
  auto endpoint = detail::reply_endpoint::open(node, client_place(o, st->trainer));
  if (!endpoint)
    return endpoint.error();
  st->replies = std::move(*endpoint);
  parameter_client client(st);
  st->replies->fail_when_lost([o, places = st->shard_places](const actors::peer_lost& lost) -> std::optional<std::string> {
    for (std::uint32_t k = 0; k < o.servers.size(); ++k)
      if (node_of(o.servers[k]) == lost.node)
        return fmt::format("parameter server shard {} ({}) was lost: node {} went away ({})", k,
                           places[k].to_string(), lost.node, lost.reason);
    return std::nullopt;
  });
  if (auto ok = await_places(node, shards, o.timeout); !ok)
    return ok.error();
  return client;
}

parameter_client::~parameter_client() { stop_now(state_); }
parameter_client::parameter_client(parameter_client&&) noexcept = default;

parameter_client& parameter_client::operator=(parameter_client&& other) noexcept {
  take_state(state_, other.state_);
  return *this;
}

void parameter_client::shutdown() { state_->stop(); }

std::uint64_t parameter_client::current_step() const {
  std::lock_guard lock(state_->mutex);
  return state_->step;
}

const parameter_server_options& parameter_client::options() const { return state_->options; }
std::uint32_t parameter_client::trainer_index() const { return state_->trainer; }

expected<tensor> parameter_client::lookup(const std::string& table, const tensor& ids, const tensor& offsets,
                                          bag_mode mode, const tensor& per_sample_weights) {
  return lookup_rows(*state_, table, ids, offsets, mode, per_sample_weights);
}

/// A trainer's ids, offsets, weights or gradient, contiguous in host memory
/// (they may come from its device); undefined stays undefined.
static tensor on_host(const tensor& t) { return t.defined() ? t.to(device::cpu()).contiguous() : t; }

static expected<tensor> lookup_rows(parameter_client::state& st, const std::string& table, const tensor& ids_in,
                                    const tensor& offsets_in, bag_mode mode, const tensor& weights_in) {
  auto t = st.table_index(table);
  if (!t)
    return t.error();
  const auto& spec = st.options.tables[*t];
  auto ids = on_host(ids_in);
  auto offsets = on_host(offsets_in);
  auto weights = on_host(weights_in);
  if (auto ok = check_bags(spec, ids, offsets, weights); !ok)
    return ok.error();
  const auto& map = st.maps[*t];
  const auto shards = map.shards;
  const auto bags = offsets.numel();
  const auto n = ids.numel();
  const auto* id = ids.data<std::int64_t>();
  const auto* off = offsets.data<std::int64_t>();
  const float* w = weights.defined() ? weights.data<float>() : nullptr;

  // Each shard gets the ids it holds, bag by bag (every bag, so that replies
  // line up), with their weights.
  std::vector<std::vector<std::int64_t>> shard_ids(shards), shard_offsets(shards);
  std::vector<std::vector<float>> shard_weights(shards);
  for (std::uint32_t k = 0; k < shards; ++k) {
    shard_ids[k].reserve(static_cast<std::size_t>(2 * n / shards + 16));
    shard_offsets[k].reserve(static_cast<std::size_t>(bags));
  }
  for (std::int64_t b = 0; b < bags; ++b) {
    for (std::uint32_t k = 0; k < shards; ++k)
      shard_offsets[k].push_back(static_cast<std::int64_t>(shard_ids[k].size()));
    auto end = b + 1 < bags ? off[b + 1] : n;
    for (auto i = off[b]; i < end; ++i) {
      auto k = map.shard_of(id[i]);
      shard_ids[k].push_back(id[i]);
      if (w)
        shard_weights[k].push_back(w[i]);
    }
  }
  std::vector<std::uint64_t> requests(shards, 0), waiting;
  std::uint64_t step = 0;
  {
    std::lock_guard lock(st.mutex);
    step = st.step;
    for (std::uint32_t k = 0; k < shards; ++k)
      if (!shard_ids[k].empty())
        waiting.push_back(requests[k] = st.next_request++);
  }
  for (auto r : waiting)
    if (auto ok = st.replies->expect(r); !ok) {
      st.replies->forget(waiting);
      return ok.error();
    }
  for (std::uint32_t k = 0; k < shards; ++k) {
    if (requests[k] == 0)
      continue;
    auto bytes = ps_wire::encode_lookup(*t, st.trainer, shard_offsets[k], shard_ids[k], shard_weights[k]);
    auto sent = st.router->send(st.shard_places[k],
                                detail::make_message(message_kind::parameters, step, k, requests[k], std::move(bytes)),
                                {}, st.replies->trace_name());
    if (!sent) {
      st.replies->forget(waiting);
      return make_error(errc::io_error, "table '{}': sending a lookup to shard {} ({}) failed: {}", table, k,
                        st.shard_places[k].to_string(), sent.error().message());
    }
  }
  // Twice the servers' bound: a server that holds a lookup (consistency)
  // answers with why it gave up first, naming the trainers it waited for.
  auto replies = st.replies->wait(waiting, 2 * st.options.timeout, fmt::format("a lookup for step {}", step));
  if (!replies)
    return make_error(errc::io_error, "table '{}': {}", table, replies.error().message());
  auto& parts = *replies;
  tensor out;
  for (auto& part : parts) {
    if (part.type() != dtype::float32 || part.shape() != dims{bags, spec.dim})
      return make_error(errc::malformed_message, "table '{}': a shard replied {} {} to {} bags of width {}", table,
                        part.type(), part.shape(), bags, spec.dim);
    if (!out.defined()) {
      out = part;
      continue;
    }
    auto* o = out.data<float>();
    const auto* p = part.data<float>();
    for (std::int64_t i = 0; i < bags * spec.dim; ++i)
      o[i] += p[i];
  }
  if (!out.defined())
    out = tensor::zeros({bags, spec.dim});
  // The replies are ours alone (the server keeps nothing it sent): sums
  // and the mean's division happen in place.
  if (mode == bag_mode::mean) {
    auto* o = out.data<float>();
    for (std::int64_t b = 0; b < bags; ++b) {
      auto len = (b + 1 < bags ? off[b + 1] : n) - off[b];
      if (len > 0)
        for (std::int64_t c = 0; c < spec.dim; ++c)
          o[b * spec.dim + c] /= static_cast<float>(len);
    }
  }
  return out.to(st.where);
}

expected<void> parameter_client::record_gradient(const std::string& table, const tensor& ids,
                                                 const tensor& offsets, bag_mode mode,
                                                 const tensor& per_sample_weights, const tensor& grad_output) {
  return record_rows(*state_, table, ids, offsets, mode, per_sample_weights, grad_output);
}

static expected<void> record_rows(parameter_client::state& st, const std::string& table, const tensor& ids_in,
                                  const tensor& offsets_in, bag_mode mode, const tensor& weights_in,
                                  const tensor& grad_in) {
  auto t = st.table_index(table);
  if (!t)
    return t.error();
  const auto& spec = st.options.tables[*t];
  auto ids = on_host(ids_in);
  auto offsets = on_host(offsets_in);
  auto weights = on_host(weights_in);
  if (auto ok = check_bags(spec, ids, offsets, weights); !ok)
    return ok.error();
  const auto bags = offsets.numel();
  if (!grad_in.defined() || grad_in.shape() != dims{bags, spec.dim})
    return make_error(errc::invalid_argument, "table '{}': the gradient of {} bags must be [{}, {}], got {}", table,
                      bags, bags, spec.dim, grad_in.defined() ? fmt::format("{}", grad_in.shape()) : "nothing");
  auto grad = on_host(grad_in).to(dtype::float32).contiguous();
  const auto* g = grad.data<float>();
  const auto* id = ids.data<std::int64_t>();
  const auto* off = offsets.data<std::int64_t>();
  const float* w = weights.defined() ? weights.data<float>() : nullptr;
  const auto n = ids.numel();
  const auto dim = spec.dim;
  std::lock_guard lock(st.mutex);
  auto& acc = st.gradients[*t];
  acc.slot.reserve(acc.slot.size() + static_cast<std::size_t>(n));
  for (std::int64_t b = 0; b < bags; ++b) {
    auto end = b + 1 < bags ? off[b + 1] : n;
    const float bag_scale = mode == bag_mode::mean && end > off[b] ? 1.0f / static_cast<float>(end - off[b]) : 1.0f;
    for (auto i = off[b]; i < end; ++i) {
      auto [slot, fresh] = acc.slot.try_emplace(id[i], acc.ids.size());
      if (fresh) {
        acc.ids.push_back(id[i]);
        acc.rows.resize(acc.rows.size() + static_cast<std::size_t>(dim), 0.0f);
      }
      float* row = acc.rows.data() + slot->second * static_cast<std::size_t>(dim);
      const float scale = (w ? w[i] : 1.0f) * bag_scale;
      for (std::int64_t c = 0; c < dim; ++c)
        row[c] += scale * g[b * dim + c];
    }
  }
  return {};
}

expected<tensor> parameter_client::pull(const std::string& table) {
  auto t = state_->table_index(table);
  if (!t)
    return t.error();
  auto every_row = arange(0, static_cast<double>(state_->options.tables[*t].rows), 1.0, dtype::int64);
  return lookup(table, every_row, every_row, bag_mode::sum);
}

expected<void> parameter_client::push_dense(const std::string& table, const tensor& grad) {
  auto t = state_->table_index(table);
  if (!t)
    return t.error();
  auto every_row = arange(0, static_cast<double>(state_->options.tables[*t].rows), 1.0, dtype::int64);
  return record_gradient(table, every_row, every_row, bag_mode::sum, {}, grad);
}

expected<void> parameter_client::step() {
  auto& st = *state_;
  std::uint64_t step = 0;
  std::vector<state::accumulated> gradients(st.options.tables.size());
  if (auto failed = st.replies->failure())
    return make_error(errc::io_error, "{}", *failed);
  {
    std::lock_guard lock(st.mutex);
    step = st.step++;
    gradients.swap(st.gradients);
    st.gradients.resize(st.options.tables.size());
  }
  for (std::uint16_t t = 0; t < gradients.size(); ++t) {
    const auto& map = st.maps[t];
    const auto dim = st.options.tables[t].dim;
    auto& acc = gradients[t];
    // Ascending ids (the servers require coalesced, sorted rows).
    std::vector<std::size_t> order(acc.ids.size());
    for (std::size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return acc.ids[a] < acc.ids[b]; });
    std::vector<std::int64_t> per_shard(map.shards, 0);
    for (auto id : acc.ids)
      ++per_shard[map.shard_of(id)];
    std::vector<ps_wire::gradients_buffer> buffers;
    std::vector<std::int64_t> filled(map.shards, 0);
    auto where = [&](std::int64_t bytes) { return outgoing_tensor(*st.router, {bytes}, dtype::uint8); };
    for (std::uint32_t k = 0; k < map.shards; ++k)
      buffers.push_back(ps_wire::make_gradients(t, st.trainer, per_shard[k], dim, where));
    for (auto i : order) {
      auto k = map.shard_of(acc.ids[i]);
      auto& b = buffers[k];
      b.ids[filled[k]] = acc.ids[i];
      std::memcpy(b.rows + filled[k] * dim, acc.rows.data() + i * static_cast<std::size_t>(dim),
                  static_cast<std::size_t>(dim) * sizeof(float));
      ++filled[k];
    }
    for (std::uint32_t k = 0; k < map.shards; ++k) {
      auto sent = st.router->send(st.shard_places[k],
                                  detail::make_message(message_kind::parameters, step, k, 0, std::move(buffers[k].bytes)),
                                  {}, st.replies->trace_name());
      if (!sent)
        return make_error(errc::io_error, "table '{}': sending step {}'s gradients to shard {} ({}) failed: {}",
                          st.options.tables[t].name, step, k, st.shard_places[k].to_string(), sent.error().message());
    }
  }
  return {};
}

// -- checkpoints of the shards, asked by a trainer (ps_checkpoint.hpp) ------------------------

std::uint64_t parameter_server_access::last_step(const parameter_client& client) { return client.current_step() - 1; }

const parameter_server_options& parameter_server_access::options(const parameter_client& client) {
  return client.options();
}

expected<void> parameter_server_access::ask_every_shard(parameter_client& client, ps_wire::op kind,
                                                        const ps_wire::checkpoint_request& request,
                                                        std::chrono::milliseconds timeout) {
  auto& st = *client.state_;
  const auto shards = static_cast<std::uint32_t>(st.shard_places.size());
  std::vector<std::uint64_t> waiting;
  {
    std::lock_guard lock(st.mutex);
    for (std::uint32_t k = 0; k < shards; ++k)
      waiting.push_back(st.next_request++);
  }
  for (auto r : waiting)
    if (auto ok = st.replies->expect(r); !ok) {
      st.replies->forget(waiting);
      return ok.error();
    }
  auto mine = request;
  mine.trainer = st.trainer;
  for (std::uint32_t k = 0; k < shards; ++k) {
    auto sent = st.router->send(st.shard_places[k],
                                detail::make_message(message_kind::parameters, request.table_step, k, waiting[k],
                                                     ps_wire::encode_checkpoint(kind, mine)),
                                {}, st.replies->trace_name());
    if (!sent) {
      st.replies->forget(waiting);
      return make_error(errc::io_error, "parameter server: sending a checkpoint request to shard {} ({}) failed: {}",
                        k, st.shard_places[k].to_string(), sent.error().message());
    }
  }
  auto replies = st.replies->wait(waiting, timeout,
                                  fmt::format("a checkpoint request (operation {}, step {})",
                                              static_cast<int>(kind), request.checkpoint_step));
  if (!replies)
    return make_error(errc::io_error, "parameter server: {}", replies.error().message());
  return {};
}

void parameter_server_access::continue_after(parameter_client& client, std::uint64_t table_step) {
  std::lock_guard lock(client.state_->mutex);
  client.state_->step = table_step + 1;
  client.state_->gradients.assign(client.state_->options.tables.size(), {});
}

void parameter_client::zero_grad() {
  std::lock_guard lock(state_->mutex);
  state_->gradients.assign(state_->options.tables.size(), {});
}

// -- autograd and the optimizer -----------------------------------------------------------------

namespace {

/// Backward of a remote lookup: records the sparse gradient with the client.
class remote_lookup_backward final : public autograd::node {
public:
  remote_lookup_backward(std::shared_ptr<parameter_client::state> client, std::string table, tensor ids,
                         tensor offsets, tensor weights, bag_mode mode)
      : client_(std::move(client)), table_(std::move(table)), ids_(std::move(ids)), offsets_(std::move(offsets)),
        weights_(std::move(weights)), mode_(mode) {
    set_next_edges({});
  }
  std::vector<tensor> apply(std::vector<tensor> grads) override {
    require(ids_.defined(), "remote_embedding_bag_backward: its saved ids were released");
    if (!grads.empty() && grads[0].defined()) {
      auto ok = record_rows(*client_, table_, ids_, offsets_, mode_, weights_, grads[0]);
      if (!ok)
        throw std::runtime_error(ok.error().message());
    }
    return {};
  }
  std::string name() const override { return "remote_embedding_bag_backward"; }
  void release_saved() override {
    ids_ = {};
    offsets_ = {};
    weights_ = {};
  }

private:
  std::shared_ptr<parameter_client::state> client_;
  std::string table_;
  tensor ids_, offsets_, weights_;
  bag_mode mode_;
};

} // namespace

remote_embedding_bag::remote_embedding_bag(parameter_client& client, std::string table, bag_mode mode)
    : client_(client.state_), table_(std::move(table)), mode_(mode) {}

autograd::variable remote_embedding_bag::operator()(const tensor& ids, const tensor& offsets,
                                                    const tensor& per_sample_weights) {
  auto out = lookup_rows(*client_, table_, ids, offsets, mode_, per_sample_weights);
  if (!out) {
    if (out.error().code() == errc::invalid_argument)
      throw usage_error(out.error().message());
    throw std::runtime_error(out.error().message());
  }
  if (!autograd::grad_enabled())
    return autograd::variable(std::move(*out));
  auto fn = std::make_shared<remote_lookup_backward>(client_, table_, ids.contiguous(), offsets.contiguous(),
                                                     per_sample_weights.defined() ? per_sample_weights.contiguous()
                                                                                  : tensor{},
                                                     mode_);
  return autograd::variable::make_result(std::move(*out), std::move(fn));
}

autograd::variable remote_embedding::operator()(const tensor& ids) {
  auto flat = ids.contiguous().reshape({ids.numel()});
  auto offsets = arange(0, static_cast<double>(ids.numel()), 1.0, dtype::int64);
  auto rows = bag_(flat, offsets);
  auto shape = ids.shape();
  shape.push_back(rows.data().shape().back());
  return autograd::reshape(rows, shape);
}

} // namespace troupe::parallel
