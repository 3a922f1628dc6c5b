// One way to send a tensor to a place: in process it is a local CAF message
// that shares the tensor's storage; to another process it goes over the UCX
// data plane, or over CAF's TLS connections when TLS is on; a lost node makes
// sends fail with its name; traces of both processes link every send to its
// receive.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <thread>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>

#include <caf/all.hpp>

#include "emulated_device.hpp"
#include "process_support.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/actors/trace_reader.hpp"
#include "troupe/actors/trace_report.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/ops.hpp"
#ifdef TROUPE_CUDA_ON_HOST
#include <cuda_runtime_api.h>
#endif

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::actors;
using troupe::test::child_process;

namespace troupe {
void PrintTo(const device& d, std::ostream* out) { *out << d.to_string(); }
} // namespace troupe

namespace {

std::uint64_t checksum(const tensor& t) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto* p = static_cast<const unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < t.nbytes(); ++i)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

tensor pattern(std::size_t bytes, std::uint64_t seed) {
  auto t = tensor::empty({static_cast<std::int64_t>(bytes)}, dtype::uint8);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (std::size_t i = 0; i < bytes; ++i)
    p[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  return t;
}

// "checker" (on worker1): answers each tensor with a one-element tensor to
// worker0/cpu/collector whose context id is the received bytes' checksum.
caf::expected<caf::actor> make_checker(std::shared_ptr<tensor_router> router, caf::actor_system& system,
                                       const place& where) {
  auto self_name = trace::intern(where.to_string());
  return system.spawn([router, self_name]() -> caf::behavior {
    return {[router, self_name](const tensor_message& m) {
      tensor_receive_scope scope(self_name, m);
      tensor_message reply;
      reply.meta.kind = message_kind::control;
      reply.meta.step = m.meta.step;
      reply.meta.context_id = checksum(m.value);
      reply.value = tensor::zeros({1});
      auto ok = router->send(*place::parse("worker0/cpu/collector"), std::move(reply), {}, self_name);
      if (!ok)
        std::printf("REPLY ERROR %s\n", ok.error().message().c_str());
    }};
  });
}

bool is_router_child(int argc, char** argv) { return argc > 1 && std::string_view(argv[1]) == "--router-child"; }

// "placer": answers each tensor with an int64 [device kind, device index]
// of where it arrived, to worker0/cpu/collector, with the checksum of its
// bytes as the context id.
tensor_message where_it_arrived(const tensor_message& m) {
  tensor_message reply;
  reply.meta.kind = message_kind::control;
  reply.meta.step = m.meta.step;
  reply.meta.context_id = checksum(m.value.to(device::cpu()));
  reply.value = tensor::from<std::int64_t>({static_cast<std::int64_t>(m.value.where().kind), m.value.where().index},
                                           {2});
  return reply;
}

int run_router_child(int argc, char** argv) {
  std::optional<test::cuda_or_emulated> devices; // the parent's, where it asks
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--emulate-devices")
      devices.emplace(2);
  auto options = node_options::from(argc, argv);
  if (!options)
    return 2;
  auto started = node::start(*options);
  if (!started) {
    std::printf("START ERROR %s\n", started.error().message().c_str());
    return 3;
  }
  auto& n = **started;
  auto router = n.router();
  n.register_factory("checker", [router](caf::actor_system& sys, const place& where, const caf::message&) {
    return make_checker(router, sys, where);
  });
  // "echo": sends every tensor it receives straight back to the collector
  // (a tensor received by reference goes back through this node's arena).
  n.register_factory("echo", [router](caf::actor_system& sys, const place&, const caf::message&) -> caf::expected<caf::actor> {
    return sys.spawn([router]() -> caf::behavior {
      return {[router](const tensor_message& m) {
        tensor_message back{m.meta, m.value, 0};
        back.meta.context_id = checksum(m.value);
        if (auto ok = router->send(*place::parse("worker0/cpu/collector"), std::move(back)); !ok)
          std::printf("ECHO ERROR %s\n", ok.error().message().c_str());
      }};
    });
  });
  n.register_factory("placer", [router](caf::actor_system& sys, const place&, const caf::message&) -> caf::expected<caf::actor> {
    return sys.spawn([router]() -> caf::behavior {
      return {[router](const tensor_message& m) {
        if (auto ok = router->send(*place::parse("worker0/cpu/collector"), where_it_arrived(m)); !ok)
          std::printf("PLACER ERROR %s\n", ok.error().message().c_str());
      }};
    });
  });
  // A sink (as troupe's reducers and parameter servers use): no device map
  // applies to it.
  router->attach_sink("worker1/cpu/sink", [router](tensor_message m) {
    if (auto ok = router->send(*place::parse("worker0/cpu/collector"), where_it_arrived(m)); !ok)
      std::printf("SINK ERROR %s\n", ok.error().message().c_str());
  });
  std::printf("READY %u plane=%s\n", static_cast<unsigned>(n.port()), router->plane() ? "ucx" : "none");
  std::fflush(stdout);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  auto s = router->stats();
  n.stop();
  std::printf("STOPPED data_plane_sends=%llu control_plane_sends=%llu arena_receives=%llu\n",
              static_cast<unsigned long long>(s.data_plane_sends),
              static_cast<unsigned long long>(s.control_plane_sends),
              static_cast<unsigned long long>(s.arena_receives));
  std::fflush(stdout);
  return 0;
}

// What the collector saw: (context id, step, data pointer) per message.
struct inbox {
  struct item {
    std::uint64_t context_id;
    std::uint64_t step;
    const void* data;
    tensor value;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<item> items;

  void add(const tensor_message& m) {
    std::lock_guard guard(mutex);
    items.push_back({m.meta.context_id, m.meta.step, m.value.raw_data(), m.value});
    changed.notify_all();
  }
  std::optional<item> wait_for_step(std::uint64_t step, std::chrono::milliseconds timeout) {
    std::unique_lock guard(mutex);
    std::optional<item> found;
    changed.wait_for(guard, timeout, [&] {
      for (auto& i : items)
        if (i.step == step)
          found = i;
      return found.has_value();
    });
    return found;
  }
};

caf::actor spawn_collector(caf::actor_system& sys, inbox& box, trace::name_id name) {
  return sys.spawn([&box, name]() -> caf::behavior {
    return {[&box, name](const tensor_message& m) {
      tensor_receive_scope scope(name, m);
      box.add(m);
    }};
  });
}

struct cluster {
  std::unique_ptr<node> coordinator;
  child_process worker;
  inbox box;
  caf::actor collector;

  ~cluster() {
    if (collector)
      caf::anon_send_exit(collector, caf::exit_reason::user_shutdown);
    worker.close_stdin();
    (void)worker.exited(10s);
    worker.kill_and_reap();
    if (coordinator)
      coordinator->stop();
  }
};

/// What a test adds to the two nodes' options.
struct cluster_extras {
  std::map<std::string, device_map> coordinator_device_maps;
  std::optional<std::chrono::milliseconds> coordinator_request_timeout;
  std::vector<std::string> worker_args;
};

void start_cluster(cluster& c, const tls_options& tls = {}, const cluster_extras& extras = {}) {
  node_options options;
  options.name = "worker0";
  options.world_size = 2;
  options.listen_address = "127.0.0.1";
  options.tls = tls;
  options.device_maps = extras.coordinator_device_maps;
  if (extras.coordinator_request_timeout)
    options.request_timeout = *extras.coordinator_request_timeout;
  auto started = node::start(options);
  ASSERT_TRUE(started) << started.error().message();
  c.coordinator = std::move(*started);
  std::vector<std::string> args{"--router-child", "--troupe.coordinator=127.0.0.1:" + std::to_string(c.coordinator->port()),
                                "--troupe.rank=1", "--troupe.world-size=2", "--troupe.listen-address=127.0.0.1",
                                "--troupe.name=worker1"};
  if (tls.requested()) {
    auto dir = std::filesystem::path(tls.ca_file).parent_path().string();
    args.push_back("--troupe.tls.certificate=" + dir + "/node2.pem");
    args.push_back("--troupe.tls.key=" + dir + "/node2.key");
    args.push_back("--troupe.tls.ca=" + tls.ca_file);
  }
  args.insert(args.end(), extras.worker_args.begin(), extras.worker_args.end());
  c.worker = child_process::start(child_process::self_path(), args,
                                  {"TROUPE_COORDINATOR=", "TROUPE_RANK=", "TROUPE_WORLD_SIZE=", "TROUPE_NODE_NAME="});
  ASSERT_TRUE(c.worker.wait_for("READY", 15s)) << c.worker.output();
  ASSERT_TRUE(c.coordinator->wait_for_nodes(2, 10s));
  auto& n = *c.coordinator;
  c.collector = spawn_collector(n.system(), c.box, trace::intern("worker0/cpu/collector"));
  ASSERT_TRUE(n.register_actor(*place::parse("worker0/cpu/collector"), c.collector));
  auto checker = n.spawn_remote(*place::parse("worker1/cpu/checker"), "checker");
  ASSERT_TRUE(checker) << checker.error().message();
}

// Sends `bytes` to worker1's checker and waits for its checksum.
void round_trip(cluster& c, std::size_t bytes, std::uint64_t step, trace::name_id sender = {}) {
  auto value = pattern(bytes, step);
  auto expected_sum = checksum(value);
  tensor_message m;
  m.meta.kind = message_kind::forward_activation;
  m.meta.step = step;
  m.value = value;
  auto ok = c.coordinator->router()->send(*place::parse("worker1/cpu/checker"), std::move(m), {}, sender);
  ASSERT_TRUE(ok) << ok.error().message();
  auto reply = c.box.wait_for_step(step, 15s);
  ASSERT_TRUE(reply) << "no reply for step " << step << "; worker output:\n" << c.worker.output();
  EXPECT_EQ(reply->context_id, expected_sum) << bytes << " bytes arrived damaged";
}

const std::string& cert_dir() {
  static const std::string dir = [] {
    auto path = std::filesystem::temp_directory_path() / ("troupe_router_test_" + std::to_string(getpid()));
    auto command = std::string(TROUPE_SOURCE_DIR) + "/scripts/make_test_certs.sh " + path.string();
    if (std::system(command.c_str()) != 0)
      ADD_FAILURE() << "make_test_certs.sh failed";
    return path.string();
  }();
  return dir;
}

} // namespace

TEST(TensorRouter, InProcessSendSharesTheTensorStorage) {
  node_options options;
  options.name = "worker0";
  options.listen_address = "127.0.0.1";
  auto n = node::start(options);
  ASSERT_TRUE(n) << n.error().message();
  inbox box;
  auto sink = spawn_collector((*n)->system(), box, {});
  auto where = *place::parse("worker0/cpu/sink");
  ASSERT_TRUE((*n)->register_actor(where, sink));
  tensor_message m;
  m.meta.step = 7;
  m.value = tensor::ones({1024, 1024}); // 4 MiB: a copy would show
  const void* data = m.value.raw_data();
  bool completed = false;
  ASSERT_TRUE((*n)->router()->send(where, std::move(m), [&](expected<void> r) { completed = r.has_value(); }));
  auto got = box.wait_for_step(7, 5s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->data, data) << "the handler saw a copy";
  EXPECT_TRUE(completed);
  auto stats = (*n)->router()->stats();
  EXPECT_EQ(stats.local_sends, 1u);
  EXPECT_EQ(stats.data_plane_sends, 0u);
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
  (*n)->stop();
}

TEST(TensorRouter, APlaceWithoutAnActorNameIsRefused) {
  node_options options;
  options.name = "worker0";
  options.listen_address = "127.0.0.1";
  auto n = node::start(options);
  ASSERT_TRUE(n) << n.error().message();
  auto ok = (*n)->router()->send(*place::parse("worker1/cpu"), tensor_message{});
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code(), errc::invalid_argument);
  (*n)->stop();
}

TEST(TensorRouter, QueuesAreBoundedAndUnreachableNodesFailTheCompletions) {
  node_options options;
  options.name = "worker0";
  options.listen_address = "127.0.0.1";
  options.request_timeout = std::chrono::milliseconds{500};
  auto n = node::start(options);
  ASSERT_TRUE(n) << n.error().message();
  auto router = (*n)->router();
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> failures;
  auto nowhere = *place::parse("worker9/cpu/x"); // never joins
  std::size_t accepted = 0;
  std::optional<troupe::error> refusal;
  for (int i = 0; i < 300 && !refusal; ++i) {
    tensor_message m;
    m.value = tensor::zeros({16});
    auto ok = router->send(nowhere, std::move(m), [&](expected<void> r) {
      std::lock_guard guard(mutex);
      failures.push_back(r ? "ok" : r.error().message());
      changed.notify_all();
    });
    if (ok)
      ++accepted;
    else
      refusal = ok.error();
  }
  EXPECT_EQ(accepted, 256u); // the bound, then back-pressure instead of a growing queue
  ASSERT_TRUE(refusal);
  EXPECT_EQ(refusal->code(), errc::size_limit_exceeded) << refusal->message();
  std::unique_lock guard(mutex);
  ASSERT_TRUE(changed.wait_for(guard, 5s, [&] { return failures.size() == accepted; })) << failures.size();
  EXPECT_NE(failures.front().find("tensor to node worker9: cannot reach it"), std::string::npos) << failures.front();
  guard.unlock();
  (*n)->stop();
}

TEST(TensorRouter, CrossProcessSendsGoOverTheDataPlaneIntact) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c));
  EXPECT_NE(c.worker.output().find("plane=ucx"), std::string::npos);
  // Through UCX: no heap tensor is copied into the arena for this test.
  c.coordinator->router()->set_copy_into_arena_min_bytes(SIZE_MAX);
  ASSERT_NO_FATAL_FAILURE(round_trip(c, 4096, 1));
  ASSERT_NO_FATAL_FAILURE(round_trip(c, std::size_t{16} << 20, 2));
  ASSERT_NO_FATAL_FAILURE(round_trip(c, 4096, 3)); // connected now: the direct path
  auto router = c.coordinator->router();
  EXPECT_EQ(router->stats().data_plane_sends, 3u);
  ASSERT_NE(router->plane(), nullptr);
  auto dp = router->plane()->stats();
  EXPECT_EQ(dp.messages_sent, 3u);
  EXPECT_GE(dp.messages_received, 3u); // the replies came back over UCX too
  EXPECT_GE(dp.bytes_sent, (std::uint64_t{16} << 20) + 8192);
}

/// Waits until the coordinator's arena has nothing lent or allocated.
bool arena_drained(tensor_router& router, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (router.arena_loans_outstanding() != 0 || router.arena()->shared_regions() != 0 ||
         router.arena()->used_bytes() != 0) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(TensorRouter, ArenaTensorsToASameHostNodeGoByReferenceAndAreReleased) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c));
  auto router = c.coordinator->router();
  ASSERT_NE(router->arena(), nullptr);
  std::uint64_t step = 1;
  auto send_and_check = [&](tensor value) {
    auto sum = checksum(value);
    tensor_message m;
    m.meta.kind = message_kind::forward_activation;
    m.meta.step = step;
    m.value = std::move(value);
    auto ok = router->send(*place::parse("worker1/cpu/checker"), std::move(m));
    ASSERT_TRUE(ok) << ok.error().message();
    auto reply = c.box.wait_for_step(step, 15s);
    ASSERT_TRUE(reply) << "no reply for step " << step << "; worker output:\n" << c.worker.output();
    EXPECT_EQ(reply->context_id, sum) << "step " << step << " arrived damaged";
    ++step;
  };
  {
    // 1. A tensor allocated in the arena: by reference, twice (the second
    // time over the direct, connected path).
    auto value = router->arena_tensor({1 << 20}, dtype::uint8);
    ASSERT_TRUE(value) << value.error().to_string();
    auto pattern_bytes = pattern(1 << 20, 7);
    std::memcpy(value->raw_data(), pattern_bytes.raw_data(), 1 << 20);
    ASSERT_NO_FATAL_FAILURE(send_and_check(*value));
    ASSERT_NO_FATAL_FAILURE(send_and_check(*value));
    EXPECT_EQ(router->stats().arena_sends, 2u);
    EXPECT_GE(router->arena()->used_bytes(), std::size_t{1} << 20); // ours still
  }
  // Both receivers' views are gone and so is ours: the region is free.
  EXPECT_TRUE(arena_drained(*router, 10s)) << "loans " << router->arena_loans_outstanding() << ", used "
                                           << router->arena()->used_bytes();
  // 2. A heap tensor, with copying into the arena chosen for every size.
  router->set_copy_into_arena_min_bytes(0);
  ASSERT_NO_FATAL_FAILURE(send_and_check(pattern(4096, 3)));
  EXPECT_EQ(router->stats().arena_copies, 1u);
  EXPECT_TRUE(arena_drained(*router, 10s));
  // 3. The arena full: arena_tensor() is an error value, and a heap tensor
  // falls back to UCX instead of waiting for room.
  auto all = router->arena_tensor({static_cast<std::int64_t>(router->arena()->capacity())}, dtype::uint8);
  ASSERT_TRUE(all) << all.error().to_string(); // untouched pages: costs no memory
  auto more = router->arena_tensor({64}, dtype::uint8);
  ASSERT_FALSE(more);
  EXPECT_EQ(more.error().code(), errc::size_limit_exceeded);
  ASSERT_NO_FATAL_FAILURE(send_and_check(pattern(4096, 4)));
  EXPECT_EQ(router->stats().arena_fallbacks, 1u);
  EXPECT_EQ(router->stats().arena_sends, 3u);
  *all = tensor{};
  router->set_copy_into_arena_min_bytes(SIZE_MAX);
  c.worker.close_stdin();
  ASSERT_TRUE(c.worker.wait_for("STOPPED", 15s)) << c.worker.output();
  EXPECT_NE(c.worker.output().find("arena_receives=3"), std::string::npos) << c.worker.output();
}

TEST(TensorRouter, ATensorReceivedByReferenceCanBeSentOnAndBack) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c));
  auto router = c.coordinator->router();
  ASSERT_TRUE(c.coordinator->spawn_remote(*place::parse("worker1/cpu/echo"), "echo"));
  // Heap tensors of 1 MiB (copied into the arena by default) out, and the
  // received, mapped tensor straight back: the first reply is queued while
  // worker1 connects to us and dropped from that queue while it drains.
  for (std::uint64_t step = 1; step <= 3; ++step) {
    auto value = pattern(1 << 20, step);
    auto sum = checksum(value);
    tensor_message m;
    m.meta.step = step;
    m.value = value;
    ASSERT_TRUE(router->send(*place::parse("worker1/cpu/echo"), std::move(m)));
    auto reply = c.box.wait_for_step(step, 15s);
    ASSERT_TRUE(reply) << "no echo for step " << step << "; worker output:\n" << c.worker.output();
    EXPECT_EQ(reply->context_id, sum);
    EXPECT_NE(reply->data, value.raw_data());
  }
  EXPECT_EQ(router->stats().arena_copies, 3u);
  EXPECT_GE(router->stats().arena_receives, 3u);
  // The collector's inbox keeps only pointers; the echoed tensors are gone,
  // so both arenas are free again.
  EXPECT_TRUE(arena_drained(*router, 10s)) << "loans " << router->arena_loans_outstanding();
}

namespace {

// Where the sending node's device map lists a tensor's device, the receiving
// router moves the tensor there before the actor sees it: host tensors onto
// a GPU, one GPU's tensors onto another; an unlisted device arrives on the
// host, a sink gets host memory, and a map naming a device the receiver
// lacks delivers on the host and counts it. On the real CUDA backend where
// there is a device, else on an emulated one (host memory): there it checks
// where tensors go, not CUDA.
void check_device_maps(const tls_options& tls) {
  const test::cuda_or_emulated devices(2);
  const bool real = !devices.emulated();
  const int ordinals = devices.ordinals();
  cluster_extras extras;
  auto map = device_map::parse(ordinals > 1 ? "cpu->cuda:1,cuda:1->cuda:0" : "cpu->cuda:0");
  ASSERT_TRUE(map) << map.error().message();
  extras.coordinator_device_maps["worker1"] = *map;
  // worker1's answers are mapped onto a device worker0 does not have.
  extras.worker_args.push_back("--troupe.device-map.worker0=cpu->cuda:7");
  if (!real)
    extras.worker_args.push_back("--emulate-devices");
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, tls, extras));
  ASSERT_TRUE(c.coordinator->spawn_remote(*place::parse("worker1/cpu/placer"), "placer"));
  auto router = c.coordinator->router();

  std::uint64_t step = 100;
  auto arrives_on = [&](const tensor& value, const char* to) -> std::optional<device> {
    const auto expected_sum = checksum(value.to(device::cpu()));
    tensor_message m;
    m.meta.kind = message_kind::forward_activation;
    m.meta.step = ++step;
    m.value = value;
    if (auto ok = router->send(*place::parse(to), std::move(m)); !ok) {
      ADD_FAILURE() << ok.error().message();
      return std::nullopt;
    }
    auto reply = c.box.wait_for_step(step, 15s);
    if (!reply) {
      ADD_FAILURE() << "no answer for step " << step << "; worker output:\n" << c.worker.output();
      return std::nullopt;
    }
    EXPECT_EQ(reply->context_id, expected_sum) << "the bytes changed on the way to " << to;
    EXPECT_EQ(reply->value.where(), device::cpu()) << "worker1's map names cuda:7, which worker0 lacks";
    auto where = reply->value.to_vector<std::int64_t>();
    return device{static_cast<device_kind>(where.at(0)), static_cast<std::int32_t>(where.at(1))};
  };

  // 4 KiB go through UCX; 1 MiB through the shared arena (same host).
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{1} << 20}) {
    SCOPED_TRACE(bytes);
    const auto host = pattern(bytes, bytes);
    EXPECT_EQ(arrives_on(host, "worker1/cpu/placer"), device::cuda(ordinals > 1 ? 1 : 0)) << "cpu is mapped";
    EXPECT_EQ(arrives_on(host.to(device::cuda(0)), "worker1/cpu/placer"), device::cpu()) << "cuda:0 is not listed";
    if (ordinals > 1) {
      EXPECT_EQ(arrives_on(host.to(device::cuda(1)), "worker1/cpu/placer"), device::cuda(0)) << "cuda:1 -> cuda:0";
    }
    EXPECT_EQ(arrives_on(host, "worker1/cpu/sink"), device::cpu()) << "sinks take what the plane carried";
  }
  const auto stats = router->stats();
  EXPECT_EQ(stats.landings, 0u);
  EXPECT_EQ(stats.landing_failures, ordinals > 1 ? 8u : 6u) << "every answer was to land on cuda:7";
}

} // namespace

TEST(TensorRouter, DeviceMapsPlaceTensorsAtTheReceiver) { check_device_maps({}); }

TEST(TensorRouter, ADeviceTensorLeavingTheProcessCarriesTheWritesQueuedBeforeTheSend) {
  // The sender does not wait for the kernels that write the tensor: the
  // router's actor waits for its copy to the host. Sent while they may
  // still be queued (nothing here waits for them), over UCX and through
  // the arena, and the host bytes rewritten at once.
  const test::cuda_or_emulated devices(1);
  cluster_extras extras;
  if (devices.emulated())
    extras.worker_args.push_back("--emulate-devices");
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, {}, extras));
  auto router = c.coordinator->router();
  std::uint64_t step = 200;
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{1} << 20, std::size_t{4096}}) {
    SCOPED_TRACE(bytes);
    auto host = pattern(bytes, bytes + 1).to(dtype::float32);
    const auto expected_sum = checksum(add(mul(host, 2.0), 1.0).to(dtype::uint8));
    tensor_message m;
    m.meta.kind = message_kind::forward_activation;
    m.meta.step = ++step;
    m.value = add(mul(host.to(device::cuda(0)), 2.0), 1.0).to(dtype::uint8);
    host.fill(0.0);
#ifdef TROUPE_CUDA_ON_HOST
    // The stand-in's streams run work only when something waits for it: a
    // sender that waited for its kernels would have run them itself.
    const auto ran_before = cuda_on_host::work_run_on_this_thread();
#endif
    ASSERT_TRUE(router->send(*place::parse("worker1/cpu/checker"), std::move(m)));
#ifdef TROUPE_CUDA_ON_HOST
    EXPECT_EQ(cuda_on_host::work_run_on_this_thread(), ran_before) << "the sender waited for its kernels";
#endif
    auto reply = c.box.wait_for_step(step, 15s);
    ASSERT_TRUE(reply) << "no reply for step " << step << "; worker output:\n" << c.worker.output();
    EXPECT_EQ(reply->context_id, expected_sum) << "the tensor left before its kernels had written it";
  }
}

TEST(TensorRouter, AnUnfinishedCopyToTheHostHoldsUpOnlyItsOwnNode) {
  // The router waits for a device tensor's copy to the host on a thread
  // of its own, not on its actor: while the copy of a send to worker1 is
  // held (the emulated device's hold), a send to another node is routed,
  // here one to a node that never joins, which fails once the registry
  // has not found it within the request timeout. A host tensor sent to
  // worker1 after the device one waits behind it; once the copy is done,
  // both arrive, in order.
  test::cuda_or_emulated devices(1);
  if (!devices.emulated())
    GTEST_SKIP() << "copies to the host are held only on the emulated device";
  cluster_extras extras;
  extras.worker_args.push_back("--emulate-devices");
  extras.coordinator_request_timeout = 1500ms;
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, {}, extras));
  auto router = c.coordinator->router();
  auto& emulated = devices.emulated_backend();
  struct release_at_exit {
    test::emulated_cuda_backend& backend;
    ~release_at_exit() { backend.release_copies_to_host(); }
  } release{emulated};
  emulated.hold_copies_to_host();

  const auto on_device = pattern(4096, 31), on_host = pattern(4096, 32);
  auto message = [](std::uint64_t step, tensor value) {
    tensor_message m;
    m.meta.kind = message_kind::forward_activation;
    m.meta.step = step;
    m.value = std::move(value);
    return m;
  };
  const auto checker = *place::parse("worker1/cpu/checker");
  ASSERT_TRUE(router->send(checker, message(301, on_device.to(device::cuda(0)))));
  ASSERT_TRUE(router->send(checker, message(302, on_host)));
  std::promise<std::string> elsewhere;
  ASSERT_TRUE(router->send(*place::parse("ghost/cpu/nobody"), message(303, pattern(64, 33)),
                           [&elsewhere](expected<void> sent) {
                             elsewhere.set_value(sent ? "sent" : sent.error().message());
                           }));
  auto outcome = elsewhere.get_future();
  ASSERT_EQ(outcome.wait_for(15s), std::future_status::ready)
    << "the send to another node waited for worker1's copy to the host";
  const auto why = outcome.get();
  EXPECT_NE(why.find("ghost"), std::string::npos) << why;
  EXPECT_EQ(emulated.copy_waits_begun(), 1) << "the router was waiting for the copy meanwhile";
  EXPECT_FALSE(c.box.wait_for_step(302, 0ms)) << "the host tensor overtook the device tensor sent before it";

  emulated.release_copies_to_host();
  auto first = c.box.wait_for_step(301, 15s);
  auto second = c.box.wait_for_step(302, 15s);
  ASSERT_TRUE(first && second) << "worker output:\n" << c.worker.output();
  EXPECT_EQ(first->context_id, checksum(on_device));
  EXPECT_EQ(second->context_id, checksum(on_host));
  std::lock_guard guard(c.box.mutex);
  auto position = [&](std::uint64_t step) {
    return std::find_if(c.box.items.begin(), c.box.items.end(), [step](const auto& i) { return i.step == step; });
  };
  EXPECT_LT(position(301), position(302)) << "worker1 answered the host tensor first";
}

TEST(TensorRouter, DeviceMapsPlaceTensorsAtTheReceiverOverTls) {
  const auto& dir = cert_dir();
  check_device_maps({dir + "/node.pem", dir + "/node.key", dir + "/ca.pem", ""});
}

TEST(TensorRouter, WithTlsTensorsTravelOverCafAndTheDataPlaneIsNotUsed) {
  auto dir = cert_dir();
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, {dir + "/node.pem", dir + "/node.key", dir + "/ca.pem", ""}));
  EXPECT_NE(c.worker.output().find("plane=none"), std::string::npos) << c.worker.output();
  ASSERT_NO_FATAL_FAILURE(round_trip(c, 4096, 1));
  ASSERT_NO_FATAL_FAILURE(round_trip(c, std::size_t{16} << 20, 2));
  auto router = c.coordinator->router();
  EXPECT_EQ(router->plane(), nullptr);
  EXPECT_EQ(router->stats().data_plane_sends, 0u);
  EXPECT_EQ(router->stats().control_plane_sends, 2u);
  c.worker.close_stdin();
  ASSERT_TRUE(c.worker.wait_for("STOPPED", 10s)) << c.worker.output();
  EXPECT_NE(c.worker.output().find("data_plane_sends=0 control_plane_sends=2"), std::string::npos)
    << c.worker.output();
  std::filesystem::remove_all(dir);
}

TEST(TensorRouter, SendsAcrossTheFirstConnectionKeepTheirOrder) {
  // The first sends to a node wait while the router connects; the ones made
  // once it is connected go straight to the data plane and must not
  // overtake them. Sends continue, paced, until well after the first one
  // went out. The echo answers over the worker's own first connection back,
  // so both directions cross one. Fewer than max_queued_sends (256) in all:
  // no send meets back-pressure.
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c));
  auto echo = c.coordinator->spawn_remote(*place::parse("worker1/cpu/echo"), "echo");
  ASSERT_TRUE(echo) << echo.error().message();
  auto router = c.coordinator->router();
  ASSERT_NE(router->plane(), nullptr);
  constexpr std::uint64_t most = 240;
  std::uint64_t sent = 0, sent_after_connecting = 0;
  while (sent < most && sent_after_connecting < 60) {
    tensor_message m;
    m.meta.kind = message_kind::forward_activation;
    m.meta.step = ++sent;
    m.value = pattern(64, sent);
    auto ok = router->send(*place::parse("worker1/cpu/echo"), std::move(m));
    ASSERT_TRUE(ok) << "step " << sent << ": " << ok.error().message();
    if (router->plane()->stats().messages_sent > 0)
      ++sent_after_connecting;
    std::this_thread::sleep_for(100us);
  }
  std::printf("%llu sends, %llu of them after the first went out\n", static_cast<unsigned long long>(sent),
              static_cast<unsigned long long>(sent_after_connecting));
  ASSERT_TRUE(c.box.wait_for_step(sent, 15s)) << c.worker.output();
  std::lock_guard guard(c.box.mutex);
  ASSERT_EQ(c.box.items.size(), sent);
  for (std::uint64_t i = 0; i < sent; ++i)
    ASSERT_EQ(c.box.items[i].step, i + 1) << "arrival " << i;
}

TEST(TensorRouter, SendsToAKilledNodeFailWithItsName) {
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c));
  ASSERT_NO_FATAL_FAILURE(round_trip(c, 4096, 1));
  std::mutex mutex;
  std::condition_variable lost_cv;
  bool lost = false;
  c.coordinator->on_peer_lost([&](const peer_lost& event) {
    std::lock_guard guard(mutex);
    lost = lost || event.node == "worker1";
    lost_cv.notify_all();
  });
  c.worker.signal(SIGKILL);
  {
    std::unique_lock guard(mutex);
    ASSERT_TRUE(lost_cv.wait_for(guard, 5s, [&] { return lost; })) << "worker1's loss was not reported";
  }
  auto start = std::chrono::steady_clock::now();
  tensor_message m;
  m.value = pattern(4096, 9);
  auto ok = c.coordinator->router()->send(*place::parse("worker1/cpu/checker"), std::move(m));
  EXPECT_LT(test::seconds_since(start), 0.5);
  ASSERT_FALSE(ok);
  EXPECT_EQ(ok.error().code(), errc::io_error);
  EXPECT_NE(ok.error().message().find("node worker1 was lost"), std::string::npos) << ok.error().message();
}

TEST(TensorRouter, TracesOfTwoProcessesLinkEverySendToItsReceive) {
  auto dir = std::filesystem::temp_directory_path() / ("troupe_router_trace_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("TROUPE_TRACE_DIR", dir.c_str(), 1);
  {
    cluster c;
    start_cluster(c);
    ::unsetenv("TROUPE_TRACE_DIR");
    ASSERT_FALSE(HasFatalFailure());
    auto driver = trace::intern("worker0/cpu/driver");
    for (std::uint64_t step = 1; step <= 5; ++step)
      ASSERT_NO_FATAL_FAILURE(round_trip(c, 64 << 10, step, driver));
  } // both nodes stop here and flush their traces
  std::vector<std::string> warnings;
  std::vector<std::string> inputs{dir.string()};
  auto files = trace::read_trace_inputs(inputs, warnings);
  ASSERT_TRUE(files) << files.error().message();
  ASSERT_EQ(files->size(), 2u);
  auto summary = trace::summarize(*files, warnings);
  std::uint64_t forward = 0, back = 0;
  for (auto& e : summary.edges) {
    if (e.sender == "worker0/cpu/driver" && e.receiver == "worker1/cpu/checker")
      forward = e.matched;
    if (e.sender == "worker1/cpu/checker" && e.receiver == "worker0/cpu/collector")
      back = e.matched;
  }
  EXPECT_EQ(forward, 5u) << trace::format_summary(summary);
  EXPECT_EQ(back, 5u) << trace::format_summary(summary);
  EXPECT_GE(summary.data_write_bytes, 5u * (64 << 10));
  EXPECT_GE(summary.data_read_bytes, 5u * (64 << 10));
  std::filesystem::remove_all(dir);
}

int main(int argc, char** argv) {
  if (is_router_child(argc, argv))
    return run_router_child(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
