// Node options from the environment (launcher, Slurm, Open MPI), the command
// line and a config file, and the error for every bad value.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "troupe/actors/node_options.hpp"
#include "troupe/actors/rendezvous.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::actors;

namespace {

troupe::expected<node_options> from(std::vector<std::string> args, environment env = {}) {
  std::vector<const char*> argv{"program"};
  for (auto& arg : args)
    argv.push_back(arg.c_str());
  return node_options::from(static_cast<int>(argv.size()), argv.data(), env);
}

std::string error_of(std::vector<std::string> args, environment env = {}) {
  auto options = from(std::move(args), std::move(env));
  return options ? "(no error)" : options.error().message();
}

} // namespace

TEST(Rendezvous, LauncherVariables) {
  auto options = from({}, {{"TROUPE_COORDINATOR", "10.0.0.1:4242"},
                           {"TROUPE_RANK", "2"},
                           {"TROUPE_WORLD_SIZE", "4"},
                           {"TROUPE_NODE_NAME", "gpu-box.3"},
                           {"TROUPE_RESTART", "1"}});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->rank, 2u);
  EXPECT_EQ(options->restart, 1u);
  EXPECT_EQ(options->world_size, 4u);
  EXPECT_EQ(options->coordinator, (endpoint{"10.0.0.1", 4242}));
  EXPECT_EQ(options->name, "gpu-box.3");
  EXPECT_FALSE(options->is_coordinator());
}

TEST(Rendezvous, SlurmAndOpenMpiVariablesAndDefaultName) {
  auto slurm = from({}, {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"TROUPE_COORDINATOR", "head:1"}});
  ASSERT_TRUE(slurm) << slurm.error().message();
  EXPECT_EQ(slurm->rank, 3u);
  EXPECT_EQ(slurm->world_size, 8u);
  EXPECT_EQ(slurm->name, "worker3");
  auto mpi = from({}, {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"TROUPE_COORDINATOR", "[::1]:9"}});
  ASSERT_TRUE(mpi) << mpi.error().message();
  EXPECT_EQ(mpi->rank, 1u);
  EXPECT_EQ(mpi->coordinator, (endpoint{"::1", 9}));
  // The launcher's variables win over the batch system's.
  auto both = from({}, {{"TROUPE_RANK", "0"}, {"TROUPE_WORLD_SIZE", "1"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "9"}});
  ASSERT_TRUE(both);
  EXPECT_EQ(both->world_size, 1u);
  auto alone = from({});
  ASSERT_TRUE(alone);
  EXPECT_TRUE(alone->is_coordinator());
  EXPECT_EQ(alone->name, "worker0");
  EXPECT_EQ(alone->restart, 0u); // not under troupe-launch --restarts: the first run
}

TEST(Rendezvous, BadVariablesNameTheVariableAndValue) {
  EXPECT_EQ(error_of({}, {{"TROUPE_RANK", "two"}}), "TROUPE_RANK=\"two\" is not a non-negative integer");
  EXPECT_EQ(error_of({}, {{"SLURM_PROCID", "-1"}}), "SLURM_PROCID=\"-1\" is not a non-negative integer");
  EXPECT_EQ(error_of({}, {{"OMPI_COMM_WORLD_SIZE", "0"}}),
            "OMPI_COMM_WORLD_SIZE=\"0\": the world size must be at least 1");
  EXPECT_EQ(error_of({}, {{"TROUPE_RANK", "4"}, {"TROUPE_WORLD_SIZE", "4"}}), "TROUPE_RANK=4 is not below TROUPE_WORLD_SIZE=4");
  EXPECT_EQ(error_of({}, {{"TROUPE_COORDINATOR", "localhost"}}), "TROUPE_COORDINATOR=\"localhost\" is not host:port (no ':')");
  EXPECT_EQ(error_of({}, {{"TROUPE_COORDINATOR", "localhost:70000"}}),
            "TROUPE_COORDINATOR=\"localhost:70000\": port \"70000\" is not in [0, 65535]");
  EXPECT_NE(error_of({}, {{"TROUPE_NODE_NAME", "a/b"}}).find("TROUPE_NODE_NAME"), std::string::npos);
  EXPECT_EQ(error_of({}, {{"TROUPE_RESTART", "-1"}}), "TROUPE_RESTART=\"-1\" is not a non-negative integer");
  EXPECT_EQ(error_of({}, {{"TROUPE_RANK", "1"}, {"TROUPE_WORLD_SIZE", "2"}}),
            "node worker1 (rank 1) needs the coordinator's address: set TROUPE_COORDINATOR=host:port or "
            "--troupe.coordinator=host:port");
}

TEST(NodeOptions, FlagsOverrideTheEnvironment) {
  auto options = from({"--troupe.rank=1", "--troupe.world-size", "3", "--troupe.name=stage-box", "--other-flag",
                       "--troupe.heartbeat-interval=250ms", "--troupe.heartbeat-timeout=2.5s",
                       "--troupe.join-timeout=1m", "--troupe.scheduler.policy=stealing",
                       "--troupe.device-map.worker2=cuda:0->cuda:1", "positional"},
                      {{"TROUPE_RANK", "0"}, {"TROUPE_WORLD_SIZE", "1"}, {"TROUPE_COORDINATOR", "127.0.0.1:5000"}});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->rank, 1u);
  EXPECT_EQ(options->world_size, 3u);
  EXPECT_EQ(options->name, "stage-box");
  EXPECT_EQ(options->heartbeat_interval, 250ms);
  EXPECT_EQ(options->heartbeat_timeout, 2500ms);
  EXPECT_EQ(options->join_timeout, 60s);
  EXPECT_EQ(options->scheduler.policy, "stealing");
  EXPECT_EQ(options->device_maps.at("worker2").landing(troupe::device::cuda(0)), troupe::device::cuda(1));
}

TEST(NodeOptions, DefaultsAreSafe) {
  node_options options;
  EXPECT_EQ(options.scheduler.policy, "sharing");
  EXPECT_GE(options.heartbeat_timeout, 5 * options.heartbeat_interval);
  EXPECT_GE(options.heartbeat_timeout, 2s) << "500 ms gave false disconnects under big transfers";
}

TEST(NodeOptions, BadFlagsNameTheFlagAndValue) {
  EXPECT_EQ(error_of({"--troupe.rank=x"}), "--troupe.rank=\"x\" is not a non-negative integer");
  EXPECT_EQ(error_of({"--troupe.port=99999"}), "--troupe.port=\"99999\" is not in [0, 65535]");
  EXPECT_EQ(error_of({"--troupe.heartbeat-interval=fast"}),
            "--troupe.heartbeat-interval=\"fast\" is not a duration (e.g. 500ms, 5s, 1.5s, 2m, 50us; a bare number "
            "is milliseconds)");
  EXPECT_EQ(error_of({"--troupe.join-timeout=0"}), "--troupe.join-timeout=\"0\" must be positive");
  EXPECT_EQ(error_of({"--troupe.scheduler.policy=fifo"}), "--troupe.scheduler.policy=\"fifo\" must be sharing or stealing");
  EXPECT_NE(error_of({"--troupe.colour=red"}).find("unknown option \"colour\""), std::string::npos);
  EXPECT_EQ(error_of({"--troupe.rank"}), "--troupe.rank needs a value (--troupe.rank=VALUE or --troupe.rank VALUE)");
  EXPECT_EQ(error_of({"--troupe.heartbeat-interval=2s", "--troupe.heartbeat-timeout=1s"}),
            "heartbeat-timeout (1000 ms) must exceed heartbeat-interval (2000 ms)");
  EXPECT_NE(error_of({"--troupe.device-map.worker1=cpu=>cuda:0"}).find("--troupe.device-map.worker1"),
            std::string::npos);
  EXPECT_EQ(error_of({"--troupe.rank=3", "--troupe.world-size=2"}), "rank 3 is not below the world size 2");
  EXPECT_EQ(error_of({"--troupe.arena-bytes=1G"}), "--troupe.arena-bytes=\"1G\" is not a byte count");
  EXPECT_NE(error_of({"--troupe.arena-bytes=99999999999999999"}).find("above the largest arena"), std::string::npos);
  // Arguments after "--" belong to the program.
  EXPECT_TRUE(from({"--", "--troupe.rank=x"}));
}

TEST(NodeOptions, ArenaSizeAndCopyThreshold) {
  auto options = from({"--troupe.arena-bytes=0", "--troupe.arena-copy-min-bytes=1048576"}, {});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->arena_bytes, 0u);
  EXPECT_EQ(options->arena_copy_min_bytes, 1048576u);
}

TEST(NodeOptions, NetworkEagerBytesIsAByteCountUpTo1GiB) {
  EXPECT_EQ(node_options{}.network_eager_bytes, 4u << 20);
  auto options = from({"--troupe.network-eager-bytes=0"}, {});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->network_eager_bytes, 0u);
  EXPECT_EQ(error_of({"--troupe.network-eager-bytes=4M"}), "--troupe.network-eager-bytes=\"4M\" is not a byte count");
  EXPECT_EQ(error_of({"--troupe.network-eager-bytes=1073741825"}),
            "--troupe.network-eager-bytes=\"1073741825\" is above 1 GiB");
}

TEST(NodeOptions, KeepFreedHeapBytesIsAByteCountBelow2GiB) {
  auto options = from({"--troupe.keep-freed-heap-bytes=0"}, {});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->keep_freed_heap_bytes, 0u);
  EXPECT_EQ(error_of({"--troupe.keep-freed-heap-bytes=1G"}), "--troupe.keep-freed-heap-bytes=\"1G\" is not a byte count");
  EXPECT_EQ(error_of({"--troupe.keep-freed-heap-bytes=2147483648"}),
            "--troupe.keep-freed-heap-bytes=\"2147483648\" is above 2 GiB");
}

TEST(NodeOptions, DataPlaneSpinTakesMicrosecondsAndIsBounded) {
  EXPECT_EQ(node_options{}.data_plane_spin, 50us);
  auto options = from({"--troupe.data-plane-spin=20us"}, {});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->data_plane_spin, 20us);
  options = from({"--troupe.data-plane-spin=0"}, {});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->data_plane_spin, 0us) << "0 turns polling off";
  options = from({"--troupe.data-plane-spin=1.5ms"}, {});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->data_plane_spin, 1500us);
  EXPECT_EQ(error_of({"--troupe.data-plane-spin=1s"}),
            "--troupe.data-plane-spin=\"1s\" is above 10ms (a poll that long is a busy core)");
  EXPECT_NE(error_of({"--troupe.data-plane-spin=-5us"}).find("is not a duration"), std::string::npos);
  EXPECT_NE(error_of({"--troupe.data-plane-spin=5ns"}).find("is not a duration"), std::string::npos);
  // Milliseconds elsewhere keep rounding to whole milliseconds.
  auto interval = parse_duration("1500us", "interval");
  ASSERT_TRUE(interval);
  EXPECT_EQ(*interval, 2ms);
}

TEST(NodeOptions, IntraOpThreadsAreACountFromOneTo1024) {
  EXPECT_EQ(node_options{}.intra_op_threads, 0u) << "0: the node leaves the process's setting";
  auto options = from({"--troupe.intra-op-threads=2"}, {});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->intra_op_threads, 2u);
  EXPECT_EQ(error_of({"--troupe.intra-op-threads=0"}), "--troupe.intra-op-threads=\"0\" must be between 1 and 1024");
  EXPECT_EQ(error_of({"--troupe.intra-op-threads=5000"}),
            "--troupe.intra-op-threads=\"5000\" must be between 1 and 1024");
  EXPECT_NE(error_of({"--troupe.intra-op-threads=two"}).find("intra-op-threads"), std::string::npos);
}

TEST(NodeOptions, CollectivesNameAnAlgorithm) {
  EXPECT_EQ(node_options{}.collectives, "automatic");
  for (const char* name : {"ring", "halving-doubling", "automatic"}) {
    auto options = from({std::string("--troupe.collectives=") + name}, {});
    ASSERT_TRUE(options) << options.error().message();
    EXPECT_EQ(options->collectives, name);
  }
  EXPECT_EQ(error_of({"--troupe.collectives=halving_doubling"}),
            "--troupe.collectives=\"halving_doubling\" must be ring, halving-doubling or automatic");
  EXPECT_EQ(error_of({"--troupe.collectives="}), "--troupe.collectives=\"\" must be ring, halving-doubling or automatic");
}

TEST(NodeOptions, ConfigFileHasTheLowestPrecedence) {
  auto path = std::string(::testing::TempDir()) + "troupe_node_options_test.conf";
  {
    std::ofstream out(path);
    out << "# a node config\nworld-size = 4\nrank = 2\ntroupe.coordinator = 10.1.1.1:7000\n"
           "request-timeout = 3s\n\n";
  }
  auto options = from({"--troupe.config=" + path, "--troupe.rank=3"});
  ASSERT_TRUE(options) << options.error().message();
  EXPECT_EQ(options->rank, 3u);
  EXPECT_EQ(options->world_size, 4u);
  EXPECT_EQ(options->request_timeout, 3s);
  auto by_env = from({}, {{"TROUPE_CONFIG", path}, {"TROUPE_RANK", "1"}, {"TROUPE_WORLD_SIZE", "4"}});
  ASSERT_TRUE(by_env);
  EXPECT_EQ(by_env->rank, 1u);
  {
    std::ofstream out(path);
    out << "world-size = 4\nrank: 2\n";
  }
  EXPECT_EQ(error_of({"--troupe.config=" + path}), path + ":2: \"rank: 2\" is not key = value");
  {
    std::ofstream out(path);
    out << "heartbeat-timeout = soon\n";
  }
  EXPECT_EQ(error_of({"--troupe.config=" + path}),
            path + ":1: heartbeat-timeout=\"soon\" is not a duration (e.g. 500ms, 5s, 1.5s, 2m, 50us; a bare number is "
                   "milliseconds)");
  std::remove(path.c_str());
  EXPECT_EQ(error_of({"--troupe.config=/nonexistent/troupe.conf"}),
            "config file \"/nonexistent/troupe.conf\" cannot be read");
}
