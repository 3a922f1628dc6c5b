// Failure detection across processes: a killed node is reported to the
// others within a second, a hung (SIGSTOPped) one within the heartbeat
// timeout, each time with the lost node's name and its actors' names.
#include <gtest/gtest.h>

#include <atomic>

#include <condition_variable>
#include <mutex>

#include <caf/all.hpp>

#include "node_child.hpp"
#include "process_support.hpp"
#include "troupe/actors/node.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::actors;
using troupe::test::child_process;

namespace {

// Collects peer_lost events from the node's agent thread.
struct loss_log {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<peer_lost> events;

  void add(const peer_lost& event) {
    std::lock_guard<std::mutex> guard(mutex);
    events.push_back(event);
    changed.notify_all();
  }
  std::optional<peer_lost> wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> guard(mutex);
    if (!changed.wait_for(guard, timeout, [&] { return !events.empty(); }))
      return std::nullopt;
    return events.front();
  }
};

struct cluster {
  std::unique_ptr<node> coordinator;
  std::vector<child_process> children;
};

// A coordinator here plus `workers` child nodes, all with these heartbeats.
void start_cluster(cluster& c, int workers, std::string interval, std::string timeout) {
  node_options options;
  options.name = "worker0";
  options.world_size = static_cast<std::uint32_t>(workers + 1);
  options.listen_address = "127.0.0.1";
  options.heartbeat_interval = *parse_duration(interval, "interval");
  options.heartbeat_timeout = *parse_duration(timeout, "timeout");
  auto started = node::start(options);
  ASSERT_TRUE(started) << started.error().message();
  c.coordinator = std::move(*started);
  for (int rank = 1; rank <= workers; ++rank) {
    c.children.push_back(child_process::start(
      child_process::self_path(),
      {"--node-child", "--troupe.coordinator=127.0.0.1:" + std::to_string(c.coordinator->port()),
       "--troupe.rank=" + std::to_string(rank), "--troupe.world-size=" + std::to_string(workers + 1),
       "--troupe.listen-address=127.0.0.1", "--troupe.heartbeat-interval=" + interval,
       "--troupe.heartbeat-timeout=" + timeout, "--troupe.name=worker" + std::to_string(rank)},
      {"TROUPE_COORDINATOR=", "TROUPE_RANK=", "TROUPE_WORLD_SIZE=", "TROUPE_NODE_NAME="}));
  }
  for (auto& child : c.children)
    ASSERT_TRUE(child.wait_for("READY", 15s)) << child.output();
  ASSERT_TRUE(c.coordinator->wait_for_nodes(static_cast<std::uint32_t>(workers + 1), 10s));
}

} // namespace

TEST(PeerMonitor, KilledPeerIsReportedWithinOneSecondWithItsName) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, 2, "500ms", "5s"));
  auto& n = *c.coordinator;
  test::add_test_factories(n);
  loss_log log;
  n.on_peer_lost([&](const peer_lost& event) { log.add(event); });
  // A handler removed before the loss is not called.
  std::atomic<int> removed_calls{0};
  n.remove_peer_lost_handler(n.on_peer_lost([&](const peer_lost&) { ++removed_calls; }));
  ASSERT_TRUE(n.spawn_remote(*place::parse("worker1/cpu/stage0"), "adder", caf::make_message(1)));
  ASSERT_TRUE(n.spawn_remote(*place::parse("worker1/cpu/stage1"), "adder", caf::make_message(2)));
  ASSERT_TRUE(n.spawn_remote(*place::parse("worker2/cpu/stage2"), "adder", caf::make_message(3)));

  auto start = std::chrono::steady_clock::now();
  c.children[0].signal(SIGKILL);
  auto lost = log.wait(1s);
  auto elapsed = test::seconds_since(start);
  ASSERT_TRUE(lost) << "no loss reported within 1 s";
  EXPECT_EQ(lost->node, "worker1");
  EXPECT_EQ(lost->actors, (std::vector<std::string>{"worker1/cpu/stage0", "worker1/cpu/stage1"}));
  EXPECT_LT(elapsed, 1.0);
  EXPECT_EQ(removed_calls.load(), 0);
  // The other worker hears about it too, by name.
  EXPECT_TRUE(c.children[1].wait_for("LOST worker1 worker1/cpu/stage0,worker1/cpu/stage1", 1s))
    << c.children[1].output();
  // The lost names are gone; the surviving node's are not.
  EXPECT_FALSE(n.lookup(*place::parse("worker1/cpu/stage0")));
  EXPECT_TRUE(n.lookup(*place::parse("worker2/cpu/stage2")));
  EXPECT_EQ(*n.nodes(), (std::vector<std::string>{"worker0", "worker2"}));
  c.children[1].close_stdin();
  EXPECT_TRUE(c.children[1].exited(10s));
}

TEST(PeerMonitor, StoppedPeerIsReportedWithinTheHeartbeatTimeout) {
  // Heartbeats every 100 ms, a peer silent for 1 s is lost.
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, 1, "100ms", "1s"));
  auto& n = *c.coordinator;
  test::add_test_factories(n);
  loss_log log;
  n.on_peer_lost([&](const peer_lost& event) { log.add(event); });
  ASSERT_TRUE(n.spawn_remote(*place::parse("worker1/cpu/stage0"), "adder", caf::make_message(1)));
  // Idle but healthy peers are not declared dead (heartbeats on both sides).
  EXPECT_FALSE(log.wait(1500ms)) << "a healthy idle peer was reported lost";

  auto start = std::chrono::steady_clock::now();
  c.children[0].signal(SIGSTOP);
  auto lost = log.wait(3s);
  auto elapsed = test::seconds_since(start);
  c.children[0].signal(SIGCONT);
  c.children[0].signal(SIGKILL);
  ASSERT_TRUE(lost) << "a stopped peer was not reported within 3 s";
  EXPECT_EQ(lost->node, "worker1");
  EXPECT_EQ(lost->actors, (std::vector<std::string>{"worker1/cpu/stage0"}));
  // Within the heartbeat timeout plus one heartbeat interval and some slack.
  EXPECT_LT(elapsed, 1.0 + 0.1 + 0.5) << "took " << elapsed << " s";
  std::printf("stopped peer reported after %.3f s (heartbeat 100 ms, timeout 1 s)\n", elapsed);
}

TEST(PeerMonitor, LossOfTheCoordinatorIsReportedToWorkers) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, 1, "500ms", "5s"));
  // Killing the coordinator in-process is not possible; stop it without
  // leaving instead: its registry goes away and the worker hears of it.
  c.coordinator.reset();
  EXPECT_TRUE(c.children[0].wait_for("LOST worker0", 2s)) << c.children[0].output();
}

int main(int argc, char** argv) {
  if (troupe::test::is_node_child(argc, argv))
    return troupe::test::run_node_child(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
