#pragma once
// The child mode shared by the multi-process node tests: the test binary
// re-executed as `<binary> --node-child --troupe.rank=1 ...` starts a node,
// registers the test factories, prints "READY <port>", prints
// "LOST <node> <actor,...>" for every lost peer, and stops cleanly when its
// stdin closes (the parent closes it, or dies).
#include <unistd.h>

#include <cstdio>
#include <string>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "troupe/actors/node.hpp"

namespace troupe::test {

/// "adder": an actor that answers (int x) with (its node's name, base + x);
/// base comes from the spawn arguments.
inline caf::expected<caf::actor> make_adder(caf::actor_system& system, const actors::place& where,
                                            const caf::message& args) {
  if (!args.match_elements<int>())
    return caf::make_error(caf::sec::cannot_spawn_actor_from_arguments);
  auto base = args.get_as<int>(0);
  auto node_name = where.node;
  // Detached: compute actors run on their own thread (docs/design.md).
  return system.spawn<caf::detached>([base, node_name]() -> caf::behavior {
    return {[base, node_name](int x) { return caf::make_message(node_name, base + x); }};
  });
}

/// "echo": an event-based actor that answers (int x) with x.
inline caf::expected<caf::actor> make_echo(caf::actor_system& system, const actors::place&, const caf::message&) {
  return system.spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
}

inline void add_test_factories(actors::node& n) {
  n.register_factory("adder", make_adder);
  n.register_factory("echo", make_echo);
}

inline bool is_node_child(int argc, char** argv) {
  return argc > 1 && std::string_view(argv[1]) == "--node-child";
}

inline int run_node_child(int argc, char** argv) {
  auto options = actors::node_options::from(argc, argv);
  if (!options) {
    std::printf("OPTIONS ERROR %s\n", options.error().message().c_str());
    return 2;
  }
  auto started = actors::node::start(*options);
  if (!started) {
    std::printf("START ERROR %s\n", started.error().message().c_str());
    return 3;
  }
  auto& n = **started;
  add_test_factories(n);
  n.on_peer_lost([](const actors::peer_lost& lost) {
    std::string names;
    for (auto& name : lost.actors)
      names += (names.empty() ? "" : ",") + name;
    std::printf("LOST %s %s\n", lost.node.c_str(), names.empty() ? "-" : names.c_str());
    std::fflush(stdout);
  });
  std::printf("READY %u\n", static_cast<unsigned>(n.port()));
  std::fflush(stdout);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  n.stop();
  std::printf("STOPPED\n");
  std::fflush(stdout);
  return 0;
}

} // namespace troupe::test
