#include "registry.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "troupe/actors/error_category.hpp"
#include "troupe/actors/message_types.hpp"

namespace troupe::actors {

namespace {

struct node_entry {
  caf::actor agent;
  caf::node_id id;
  std::map<std::string, std::string> device_maps; // destination node -> device_map text
  std::string data_address;                       // its UCX worker address (tensor_router)
};

struct registry_state {
  std::map<std::string, node_entry> nodes;   // by node name
  std::map<std::string, caf::actor> names;   // by place string
  std::vector<std::pair<std::uint32_t, caf::response_promise>> waiters;
  // Requests for names not registered yet, answered when they are, each
  // with the time its requester stops waiting: expired ones are dropped at
  // every new request, so only live requests are kept.
  struct name_waiter {
    caf::response_promise promise;
    std::chrono::steady_clock::time_point expires;
  };
  std::multimap<std::string, name_waiter> name_waiters;
  std::string coordinator_name;
  std::uint64_t job_token = 0;
  static inline const char* name = "troupe.registry";
};

using registry_actor = caf::stateful_actor<registry_state>;

std::vector<std::string> names_on(registry_state& st, const caf::node_id& id) {
  std::vector<std::string> result;
  for (auto& [name, handle] : st.names)
    if (handle.node() == id)
      result.push_back(name);
  return result; // std::map keeps them sorted
}

void release_waiters(registry_state& st) {
  auto count = static_cast<std::uint32_t>(st.nodes.size());
  auto ready = std::stable_partition(st.waiters.begin(), st.waiters.end(),
                                     [&](auto& waiter) { return waiter.first > count; });
  for (auto i = ready; i != st.waiters.end(); ++i)
    i->second.deliver(caf::ok_atom::value);
  st.waiters.erase(ready, st.waiters.end());
}

// Removes a node and its names; tells the remaining agents unless it left.
void drop_node(registry_actor* self, std::map<std::string, node_entry>::iterator entry, bool report,
               const std::string& reason) {
  auto& st = self->state;
  auto node_name = entry->first;
  auto id = entry->second.id;
  auto lost_names = names_on(st, id);
  for (auto& name : lost_names)
    st.names.erase(name);
  st.nodes.erase(entry);
  if (!report)
    return;
  for (auto& [other, info] : st.nodes)
    self->send(info.agent, node_lost_atom_v, node_name, lost_names, reason);
}

caf::behavior registry(registry_actor* self, std::string coordinator_name, std::uint64_t job_token) {
  self->state.coordinator_name = std::move(coordinator_name);
  self->state.job_token = job_token;
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& st = self->state;
    auto reason = to_string(msg.reason);
    // The agent of a node: the node is gone (killed, hung past the heartbeat
    // timeout, or its actor system stopped without leaving).
    auto agent = std::find_if(st.nodes.begin(), st.nodes.end(),
                              [&](auto& entry) { return entry.second.agent.address() == msg.source; });
    if (agent != st.nodes.end()) {
      drop_node(self, agent, true, reason);
      return;
    }
    // A registered actor whose connection broke: its whole node is lost
    // (the agent's down message may come later; report the node once).
    if (msg.reason == caf::exit_reason::remote_link_unreachable || msg.reason == caf::sec::connection_timeout) {
      auto node = std::find_if(st.nodes.begin(), st.nodes.end(),
                               [&](auto& entry) { return entry.second.id == msg.source.node(); });
      if (node != st.nodes.end()) {
        drop_node(self, node, true, reason);
        return;
      }
    }
    for (auto i = st.names.begin(); i != st.names.end();) {
      if (i->second.address() == msg.source)
        i = st.names.erase(i);
      else
        ++i;
    }
  });
  return {
    [self](reg_node_atom, const std::string& name, const caf::actor& agent,
           const std::map<std::string, std::string>& device_maps) -> caf::result<std::string> {
      auto& st = self->state;
      if (!agent)
        return make_caf_error(errc::invalid_argument, "node " + name + " joined without an agent");
      if (auto i = st.nodes.find(name); i != st.nodes.end())
        return make_caf_error(errc::invalid_argument, "a node named " + name + " has already joined");
      self->monitor(agent);
      st.nodes.emplace(name, node_entry{agent, agent.node(), device_maps, {}});
      for (auto& [other, info] : st.nodes)
        if (other != name)
          self->send(info.agent, joined_atom_v, name);
      release_waiters(st);
      return st.coordinator_name;
    },
    [self](leave_atom, const std::string& name) {
      auto& st = self->state;
      if (auto i = st.nodes.find(name); i != st.nodes.end()) {
        self->demonitor(i->second.agent);
        drop_node(self, i, false, {});
      }
      return caf::ok_atom::value;
    },
    [self](reg_name_atom, const std::string& name, const caf::actor& handle) -> caf::result<caf::ok_atom> {
      auto& st = self->state;
      if (!handle)
        return make_caf_error(errc::invalid_argument, "cannot register an invalid actor as " + name);
      auto [i, inserted] = st.names.emplace(name, handle);
      if (!inserted && i->second != handle)
        return make_caf_error(errc::invalid_argument, "the name " + name + " is already registered");
      self->monitor(handle);
      auto [first, last] = st.name_waiters.equal_range(name);
      for (auto w = first; w != last; ++w)
        w->second.promise.deliver(handle);
      st.name_waiters.erase(first, last);
      return caf::ok_atom::value;
    },
    [self](await_name_atom, const std::string& name, std::int64_t timeout_ms) -> caf::result<caf::actor> {
      auto& st = self->state;
      if (auto i = st.names.find(name); i != st.names.end())
        return i->second;
      const auto now = std::chrono::steady_clock::now();
      std::erase_if(st.name_waiters, [&](const auto& w) { return w.second.expires < now; });
      auto promise = self->make_response_promise();
      st.name_waiters.emplace(name, registry_state::name_waiter{
                                      promise, now + std::chrono::milliseconds{std::max<std::int64_t>(timeout_ms, 0)}});
      return promise;
    },
    [self](await_name_atom, waiting_atom) { return static_cast<std::uint64_t>(self->state.name_waiters.size()); },
    [self](unreg_name_atom, const std::string& name) {
      self->state.names.erase(name);
      return caf::ok_atom::value;
    },
    [self](lookup_name_atom, const std::string& name) -> caf::result<caf::actor> {
      auto& st = self->state;
      if (auto i = st.names.find(name); i != st.names.end())
        return i->second;
      return make_caf_error(errc::invalid_argument, "no actor is registered as " + name);
    },
    [self](lookup_node_atom, const std::string& name) -> caf::result<caf::actor> {
      auto& st = self->state;
      if (auto i = st.nodes.find(name); i != st.nodes.end())
        return i->second.agent;
      return make_caf_error(errc::invalid_argument, "no node named " + name + " has joined");
    },
    [self](list_nodes_atom) {
      std::vector<std::string> names;
      for (auto& [name, info] : self->state.nodes)
        names.push_back(name);
      return names;
    },
    [self](await_nodes_atom, std::uint32_t count) -> caf::result<caf::ok_atom> {
      auto& st = self->state;
      if (st.nodes.size() >= count)
        return caf::ok_atom::value;
      auto promise = self->make_response_promise();
      st.waiters.emplace_back(count, promise);
      return promise;
    },
    [self](job_token_atom) { return self->state.job_token; },
    // The coordinator's system clock, for the clock offsets of traces.
    [](clock_atom) {
      return static_cast<std::int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count());
    },
    [self](data_address_atom, const std::string& name, const std::string& address) -> caf::result<caf::ok_atom> {
      auto i = self->state.nodes.find(name);
      if (i == self->state.nodes.end())
        return make_caf_error(errc::invalid_argument, "no node named " + name + " has joined");
      i->second.data_address = address;
      return caf::ok_atom::value;
    },
    [self](data_address_atom, const std::string& name) -> caf::result<std::string> {
      auto i = self->state.nodes.find(name);
      if (i == self->state.nodes.end())
        return make_caf_error(errc::invalid_argument, "no node named " + name + " has joined");
      if (i->second.data_address.empty())
        return make_caf_error(errc::invalid_argument, "node " + name + " has not published a data-plane address yet");
      return i->second.data_address;
    },
    [self](device_map_atom, const std::string& from, const std::string& to) -> caf::result<std::string> {
      auto& st = self->state;
      auto i = st.nodes.find(from);
      if (i == st.nodes.end())
        return make_caf_error(errc::invalid_argument, "no node named " + from + " has joined");
      auto map = i->second.device_maps.find(to);
      return map == i->second.device_maps.end() ? std::string{} : map->second;
    },
  };
}

} // namespace

caf::actor spawn_registry(caf::actor_system& system, std::string coordinator_name, std::uint64_t job_token) {
  return system.spawn(registry, std::move(coordinator_name), job_token);
}

} // namespace troupe::actors
