#pragma once
// Scaffolding shared by the reducer-ring tests: N reducers on one node in
// this process (ranks as threads, as Gloo's tests do), and a cluster of
// child processes (this test binary re-executed as the other nodes).
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "../actors/process_support.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/parallel/reducer_group.hpp"

namespace troupe::test {

using namespace std::chrono_literals;
using parallel::reducer_group;
using parallel::reducer_group_options;

/// A one-process job: node "worker0" on loopback, with `collectives` as
/// its --troupe.collectives.
inline expected<std::unique_ptr<actors::node>> start_local_node(std::string collectives = "automatic") {
  actors::node_options options;
  options.collectives = std::move(collectives);
  options.name = "worker0";
  options.world_size = 1;
  options.listen_address = "127.0.0.1";
  return actors::node::start(options);
}

/// N reducers in this process, on one node.
struct local_ring {
  std::unique_ptr<actors::node> node;
  std::vector<std::optional<reducer_group>> groups; // empty where joining failed

  explicit local_ring(std::uint32_t n, std::size_t chunk_bytes = 1024,
                      std::chrono::milliseconds timeout = 5000ms, std::uint32_t min_chunks = 1,
                      parallel::same_host_algorithm same_host = parallel::same_host_algorithm::shared_memory,
                      std::size_t same_host_pass_bytes = std::size_t{256} << 10, bool same_host_single_copy = true,
                      std::optional<parallel::message_algorithm> messages = parallel::message_algorithm::ring,
                      std::string node_collectives = "automatic") {
    auto started = start_local_node(std::move(node_collectives));
    EXPECT_TRUE(started) << started.error().message();
    if (!started)
      return;
    node = std::move(*started);
    std::vector<std::string> places;
    for (std::uint32_t k = 0; k < n; ++k)
      places.push_back("worker0/cpu/reducer" + std::to_string(k));
    groups.resize(n);
    std::vector<std::thread> joins;
    for (std::uint32_t k = 0; k < n; ++k)
      joins.emplace_back([&, k] {
        reducer_group_options o{.rank = k, .places = places, .chunk_bytes = chunk_bytes, .min_chunks = min_chunks,
                                .timeout = timeout, .same_host = same_host,
                                .same_host_pass_bytes = same_host_pass_bytes,
                                .same_host_single_copy = same_host_single_copy, .messages = messages};
        auto g = reducer_group::join(*node, o);
        if (g)
          groups[k].emplace(std::move(*g));
        else
          ADD_FAILURE() << g.error().message();
      });
    for (auto& t : joins)
      t.join();
  }
  ~local_ring() {
    groups.clear();
    if (node)
      node->stop();
  }

  /// Runs `f(rank)` on one thread per rank.
  template <class F> void each(F&& f) {
    std::vector<std::thread> threads;
    for (std::uint32_t k = 0; k < groups.size(); ++k)
      threads.emplace_back([&, k] { f(k); });
    for (auto& t : threads)
      t.join();
  }
};

/// Reducer places worker0/cpu/reducer0 ... for one rank per node.
inline std::vector<std::string> places_for(std::uint32_t n) {
  std::vector<std::string> names;
  for (std::uint32_t k = 0; k < n; ++k)
    names.push_back("worker" + std::to_string(k));
  return parallel::reducer_places(names);
}

/// The coordinator (rank 0, this process) and the child processes.
struct cluster {
  std::unique_ptr<actors::node> coordinator;
  std::vector<child_process> workers;
  ~cluster() {
    for (auto& w : workers) {
      w.close_stdin();
      (void)w.exited(10s);
      w.kill_and_reap();
    }
    if (coordinator)
      coordinator->stop();
  }
};

/// Starts ranks 1..n-1 as `self <mode> --troupe.*` children and waits
/// until every node has joined.
inline void start_cluster(cluster& c, std::uint32_t n, const char* mode) {
  actors::node_options options;
  options.name = "worker0";
  options.world_size = n;
  options.listen_address = "127.0.0.1";
  auto started = actors::node::start(options);
  ASSERT_TRUE(started) << started.error().message();
  c.coordinator = std::move(*started);
  for (std::uint32_t k = 1; k < n; ++k) {
    std::vector<std::string> args{mode,
                                  "--troupe.coordinator=127.0.0.1:" + std::to_string(c.coordinator->port()),
                                  "--troupe.rank=" + std::to_string(k), "--troupe.world-size=" + std::to_string(n),
                                  "--troupe.listen-address=127.0.0.1", "--troupe.name=worker" + std::to_string(k)};
    c.workers.push_back(child_process::start(child_process::self_path(), args,
                                             {"TROUPE_COORDINATOR=", "TROUPE_RANK=", "TROUPE_WORLD_SIZE=",
                                              "TROUPE_NODE_NAME=", "OPENBLAS_NUM_THREADS=1"}));
  }
  ASSERT_TRUE(c.coordinator->wait_for_nodes(n, 15s));
}

/// The child side of start_cluster: starts the node its --troupe.* flags
/// describe, runs `setup` on it (factories, hosted tables), prints READY and
/// serves until its stdin closes; then runs what `setup` returned (may be
/// empty) and stops the node. Exit code 2: bad flags; 3: the node did not
/// start ("START ERROR <why>" on stdout); else 0.
inline int serve_as_child_node(int argc, char** argv,
                               const std::function<std::function<void()>(actors::node&)>& setup) {
  auto options = actors::node_options::from(argc, argv);
  if (!options)
    return 2;
  auto started = actors::node::start(*options);
  if (!started) {
    std::printf("START ERROR %s\n", started.error().message().c_str());
    return 3;
  }
  auto before_stop = setup(**started);
  std::printf("READY\n");
  std::fflush(stdout);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  if (before_stop)
    before_stop();
  (*started)->stop();
  return 0;
}

} // namespace troupe::test
