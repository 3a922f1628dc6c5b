// Moving messages and tensors between two processes on this host, by every
// path troupe has, beside the peers measured in the same run:
//   control plane   CAF request/response between two nodes (64 B)
//   data plane      UCX active messages (tcp, and shared memory sm,self)
//   shared arena    tensors handed over by reference (no bytes move)
//   same host       tensor_router to a node on this host: an arena tensor (by
//                   reference), a heap tensor through UCX, a heap tensor
//                   copied into the arena; rounds interleaved
//   tracing         data-plane throughput with tracing on and off in both
//                   processes, toggled within one session, rounds interleaved
//   TLS             tensor_message over CAF's mutual-TLS connection
//   in process      a tensor_message between two actors (by reference)
// Peers: ucx_perftest (ucp_am_bw / ucp_am_lat, same window) and PyTorch RPC
// (bench/peers/rpc_latency.py --quick, transports default and uv). Over
// tcp from 1 MiB, perftest runs four ways: polling (its default) and
// sleeping on its event fd (-E sleep, as our transport thread does), each as
// shipped and with its buffers written (perftest_written_buffers.c: as
// shipped it sends the kernel's zero page).
//
//   build/bench/transport [--json] [--quick] [--no-peers] [--rounds=N]
//                         [--only=inprocess,control,plane,samehost,tracing,tls]
//
// The benchmark re-executes itself as the second process (--child=...).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "baselines.hpp"
#include "peer_process.hpp"
#include "report.hpp"
#include "troupe/actors/data_plane.hpp"
#include "troupe/actors/message_types.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/shared_arena.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/tensor/ops.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::actors;

namespace {

constexpr std::uint64_t job_token = 0x7472'6f75'7065'0001; // any nonzero value shared by both sides

std::string self_path() {
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

std::string to_hex(std::span<const std::byte> bytes) {
  std::string out;
  for (auto b : bytes)
    out += fmt::format("{:02x}", static_cast<unsigned>(b));
  return out;
}

std::vector<std::byte> from_hex(std::string_view hex) {
  std::vector<std::byte> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<std::byte>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

tensor payload_of(std::size_t bytes) {
  auto t = tensor::empty({static_cast<std::int64_t>(bytes)}, dtype::uint8);
  std::memset(t.raw_data(), 0x5a, bytes);
  return t;
}

// -- the arena handoff on the wire (bench-local framing) ----------------------------

tensor encode_handoff(const arena_handoff& h) {
  std::vector<std::byte> bytes;
  auto put = [&](const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    bytes.insert(bytes.end(), b, b + n);
  };
  auto name_size = static_cast<std::uint32_t>(h.region.arena.size());
  auto header_size = static_cast<std::uint32_t>(h.header.size());
  put(&name_size, 4);
  put(h.region.arena.data(), name_size);
  put(&h.region.offset, 8);
  put(&h.region.length, 8);
  put(&header_size, 4);
  put(h.header.data(), header_size);
  auto t = tensor::empty({static_cast<std::int64_t>(bytes.size())}, dtype::uint8);
  std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

std::optional<arena_handoff> decode_handoff(const tensor& t) {
  auto* p = static_cast<const std::byte*>(t.raw_data());
  std::size_t n = t.nbytes(), at = 0;
  auto get = [&](void* out, std::size_t k) {
    if (at + k > n)
      return false;
    std::memcpy(out, p + at, k);
    at += k;
    return true;
  };
  arena_handoff h;
  std::uint32_t size = 0;
  if (!get(&size, 4) || size > 256)
    return std::nullopt;
  h.region.arena.resize(size);
  if (!get(h.region.arena.data(), size) || !get(&h.region.offset, 8) || !get(&h.region.length, 8) ||
      !get(&size, 4) || size > 65536)
    return std::nullopt;
  h.header.resize(size);
  if (!get(h.header.data(), size))
    return std::nullopt;
  return h;
}

// -- child: data plane server -------------------------------------------------------

/// Echoes "echo" messages, drops "sink" ones (their credits return when the
/// handler returns), opens "arena" handoffs and releases them at once.
int child_plane(const std::string& transports, std::chrono::microseconds spin) {
  std::unique_ptr<data_plane>* plane_ptr = nullptr;
  std::mutex mutex;
  std::vector<std::pair<peer_id, arena_ref>> releases;
  arena_mapper mapper([&](const arena_ref& region) {
    std::lock_guard guard(mutex);
    releases.emplace_back(0, region);
  });
  data_plane_options options;
  options.node_name = "child";
  options.token = job_token;
  options.transports = transports;
  options.net_devices = "lo"; // loopback only (UCX would open a lane on every interface)
  options.max_queued_sends = 4096;
  options.spin_before_sleep = spin;
  options.on_receive = [&](peer_id from, tensor_message&& m) {
    auto& plane = **plane_ptr;
    if (m.meta.destination == "echo") {
      (void)plane.send(from, std::move(m));
    } else if (m.meta.destination == "arena") {
      if (auto handoff = decode_handoff(m.value)) {
        auto opened = mapper.open(*handoff); // maps the region: no copy
        if (!opened)
          fmt::print(stderr, "transport child: {}\n", opened.error().to_string());
        // Dropping the tensor runs the release function.
      } else {
        fmt::print(stderr, "transport child: malformed arena handoff\n");
      }
      std::vector<std::pair<peer_id, arena_ref>> pending;
      {
        std::lock_guard guard(mutex);
        pending.swap(releases);
      }
      for (auto& [ignored, region] : pending) {
        tensor_message release;
        release.meta.destination = "release";
        release.value = tensor::scalar(static_cast<double>(region.offset), dtype::int64);
        (void)plane.send(from, std::move(release));
      }
    }
  };
  auto started = data_plane::start(options);
  if (!started) {
    fmt::print("ERROR {}\n", started.error().to_string());
    return 1;
  }
  plane_ptr = &*started;
  fmt::print("ADDRESS {}\n", to_hex((*started)->address()));
  std::fflush(stdout);
  std::string line;
  // "trace on DIR" / "trace off": the parent toggles tracing between rounds.
  while (std::getline(std::cin, line) && line != "quit") {
    if (line.starts_with("trace on ")) {
      trace::options topts;
      topts.directory = line.substr(9);
      topts.node = "child";
      topts.rank = 1;
      auto ok = trace::start(topts);
      fmt::print("{}\n", ok ? "TRACE ON" : "ERROR " + ok.error().to_string());
    } else if (line == "trace off") {
      trace::stop();
      fmt::print("TRACE OFF\n");
    }
    std::fflush(stdout);
  }
  (*started)->close();
  trace::stop();
  return 0;
}

// -- child: CAF node with an echo and a tensor sink ------------------------------------

int child_node(int argc, char** argv) {
  auto options = node_options::from(argc, argv);
  if (!options) {
    fmt::print("ERROR {}\n", options.error().message());
    return 2;
  }
  auto started = node::start(*options);
  if (!started) {
    fmt::print("ERROR {}\n", started.error().message());
    return 3;
  }
  auto& n = **started;
  n.register_factory("echo", [](caf::actor_system& sys, const place&, const caf::message&) -> caf::expected<caf::actor> {
    return sys.spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
  });
  n.register_factory("sink", [](caf::actor_system& sys, const place&, const caf::message&) -> caf::expected<caf::actor> {
    return sys.spawn([]() -> caf::behavior {
      return {[](const tensor_message& m) { return static_cast<std::int64_t>(m.value.nbytes()); }};
    });
  });
  // "acker": answers each tensor with a one-element tensor to
  // worker0/cpu/acks (same step), its context id a sample of the bytes it
  // received (64 bytes spread over the tensor: cheap, yet a wrong mapping shows).
  auto router = n.router();
  n.register_factory("acker", [router](caf::actor_system& sys, const place&, const caf::message&) -> caf::expected<caf::actor> {
    return sys.spawn([router]() -> caf::behavior {
      auto acks = *place::parse("worker0/cpu/acks");
      return {[router, acks](const tensor_message& m) {
        std::uint64_t sample = 0;
        auto* p = static_cast<const unsigned char*>(m.value.raw_data());
        auto n = m.value.nbytes();
        for (std::size_t i = 0; i < 64 && n > 0; ++i)
          sample = sample * 31 + p[i * (n - 1) / 63];
        tensor_message ack;
        ack.meta.kind = message_kind::control;
        ack.meta.step = m.meta.step;
        ack.meta.context_id = sample;
        ack.value = tensor::zeros({1});
        (void)router->send(acks, std::move(ack));
      }};
    });
  });
  fmt::print("READY {}\n", n.port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
  }
  n.stop();
  return 0;
}

// CAF as shipped, without troupe's guard: the same scheduler and heartbeat
// settings as a node, an echo published with the middleman's own publish().
void configure_like_a_node(caf::actor_system_config& config) {
  config.load<caf::io::middleman>();
  node_options defaults;
  config.set("scheduler.policy", caf::atom_from_string(defaults.scheduler.policy));
  config.set("scheduler.max-threads", static_cast<std::size_t>(std::max(1u, std::thread::hardware_concurrency())));
  config.set("middleman.heartbeat-interval", caf::timespan{defaults.heartbeat_interval});
  config.set("middleman.connection-timeout", caf::timespan{defaults.heartbeat_timeout});
}

int child_unguarded_caf() {
  caf::actor_system_config config;
  configure_like_a_node(config);
  caf::actor_system sys{config};
  auto echo = sys.spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
  auto port = sys.middleman().publish(echo, 0, "127.0.0.1", true);
  if (!port) {
    fmt::print("ERROR {}\n", sys.render(port.error()));
    return 3;
  }
  fmt::print("READY {}\n", *port);
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
  }
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  return 0;
}

// -- parent side ------------------------------------------------------------------------

struct sizes_and_counts {
  std::size_t bytes;
  int count;
};

std::vector<sizes_and_counts> throughput_cases(bool quick) {
  if (quick)
    return {{4 << 10, 2000}, {1 << 20, 100}, {16 << 20, 10}, {64 << 20, 4}};
  return {{4 << 10, 10000}, {1 << 20, 400}, {16 << 20, 40}, {64 << 20, 12}};
}

/// The data plane to a child server over `transports`.
class plane_session {
public:
  /// Untraced; set_tracing() turns tracing on and off in both processes.
  /// `spin`: both data planes' spin_before_sleep.
  explicit plane_session(const std::string& transports,
                         std::chrono::microseconds spin = data_plane_options{}.spin_before_sleep)
      : child_({self_path(), "--child=plane", "--transports=" + transports,
                fmt::format("--spin-us={}", spin.count())}) {
    data_plane_options options;
    options.spin_before_sleep = spin;
    options.node_name = "parent";
    options.token = job_token;
    options.transports = transports;
    options.net_devices = "lo"; // loopback only (UCX would open a lane on every interface)
    options.max_queued_sends = 4096;
    options.on_receive = [this](peer_id, tensor_message&& m) {
      std::lock_guard guard(mutex_);
      if (m.meta.destination == "release")
        released_.push_back(static_cast<std::uint64_t>(m.value.item()));
      else
        ++echoes_;
      cv_.notify_all();
    };
    auto started = data_plane::start(options);
    if (!started)
      throw std::runtime_error(started.error().to_string());
    plane_ = std::move(*started);
    auto line = child_.read_line(20'000).value_or("");
    if (!line.starts_with("ADDRESS "))
      throw std::runtime_error("data plane child did not start: " + line);
    auto peer = plane_->connect("child", from_hex(line.substr(8)));
    if (!peer)
      throw std::runtime_error(peer.error().to_string());
    peer_ = *peer;
  }
  ~plane_session() {
    plane_->close();
    trace::stop();
  }

  /// Median round trip of a 64 B message to the echo, in µs.
  double round_trip_us(int count) {
    auto payload = payload_of(64);
    std::vector<double> samples;
    for (int i = 0; i < count + 100; ++i) {
      tensor_message m{{message_kind::control, 0, 0, 0, "echo"}, payload, 0};
      auto start = now();
      std::unique_lock lock(mutex_);
      auto before = echoes_;
      lock.unlock();
      if (!plane_->send(peer_, std::move(m)))
        throw std::runtime_error("send refused");
      lock.lock();
      if (!cv_.wait_for(lock, 5s, [&] { return echoes_ > before; }))
        throw std::runtime_error("no echo within 5 s");
      if (i >= 100)
        samples.push_back((now() - start) * 1e6);
    }
    return bench::median(samples);
  }

  /// One-way GB/s: `count` messages of `bytes` to the sink, at most
  /// `window` messages' worth of credits in flight, timed until the last
  /// credit has come back (the receiver delivered everything).
  double throughput_gbps(std::size_t bytes, int count) {
    auto payload = payload_of(bytes);
    auto run = [&](int n) {
      std::mutex mutex;
      std::condition_variable all_done;
      int done = 0;
      auto on_done = [&](expected<void>) {
        std::lock_guard guard(mutex);
        if (++done == n)
          all_done.notify_one();
      };
      auto start = now();
      for (int i = 0; i < n; ++i) {
        tensor_message m{{message_kind::forward_activation, 0, 0, 0, "sink"}, payload, 0};
        while (!plane_->send(peer_, m, on_done))
          std::this_thread::sleep_for(20us); // back-pressure: the queue is full
      }
      // Sleep until the last send completed (a poll here would take CPU
      // from the transport threads on two cores), then wait for its ack.
      {
        std::unique_lock lock(mutex);
        all_done.wait_for(lock, 60s, [&] { return done == n; });
      }
      auto deadline = now() + 60;
      while (plane_->in_flight_bytes(peer_) > 0 && now() < deadline)
        std::this_thread::sleep_for(20us);
      return now() - start;
    };
    run(std::max(count / 10, 2));
    return double(bytes) * count / run(count) / 1e9;
  }

  /// GB/s equivalent of handing `bytes` over by reference through a shared
  /// arena, four regions in flight: payload bytes / (handoff + release).
  double arena_gbps(std::size_t bytes, int count) {
    auto arena = shared_arena::create(shared_arena::name_for(fmt::format("bench{}-{}", ::getpid(), bytes), "parent"),
                                      4 * (bytes + 4096));
    if (!arena)
      throw std::runtime_error(arena.error().to_string());
    std::vector<tensor> regions;
    for (int i = 0; i < 4; ++i) {
      auto t = (*arena)->allocate({static_cast<std::int64_t>(bytes)}, dtype::uint8);
      if (!t)
        throw std::runtime_error(t.error().to_string());
      regions.push_back(*t);
    }
    std::vector<arena_ref> in_flight;
    auto start = now();
    int sent = 0, returned = 0;
    while (returned < count) {
      while (sent < count && sent - returned < 4) {
        auto h = (*arena)->share({message_kind::forward_activation, 0, 0, 0, "arena"}, regions[sent % 4]);
        if (!h)
          throw std::runtime_error(h.error().to_string());
        tensor_message m{{message_kind::control, 0, 0, 0, "arena"}, encode_handoff(*h), 0};
        if (!plane_->send(peer_, std::move(m)))
          throw std::runtime_error("send refused");
        in_flight.push_back(h->region);
        ++sent;
      }
      std::unique_lock lock(mutex_);
      if (!cv_.wait_for(lock, 5s, [&] { return !released_.empty(); }))
        throw std::runtime_error("no release within 5 s");
      for (auto offset : released_) {
        for (auto it = in_flight.begin(); it != in_flight.end(); ++it) {
          if (it->offset == offset) {
            (void)(*arena)->release(*it);
            in_flight.erase(it);
            ++returned;
            break;
          }
        }
      }
      released_.clear();
    }
    return double(bytes) * count / (now() - start) / 1e9;
  }

  data_plane& plane() { return *plane_; }

  /// Starts (dir non-empty) or stops tracing in both processes.
  void set_tracing(const std::string& dir) {
    if (!dir.empty()) {
      trace::options topts;
      topts.directory = dir;
      topts.node = "parent";
      topts.rank = 0;
      if (auto ok = trace::start(topts); !ok)
        throw std::runtime_error(ok.error().to_string());
      if (child_.ask("trace on " + dir, 10'000).value_or("") != "TRACE ON")
        throw std::runtime_error("the child did not start tracing");
    } else {
      trace::stop();
      if (child_.ask("trace off", 10'000).value_or("") != "TRACE OFF")
        throw std::runtime_error("the child did not stop tracing");
    }
  }

private:
  static double now() { return bench::now_seconds(); }

  bench::peer_process child_;
  std::unique_ptr<data_plane> plane_;
  peer_id peer_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::uint64_t echoes_ = 0;
  std::vector<std::uint64_t> released_;
};

/// Median round trip in µs of an int to `echo` and back, after 100 warm-up
/// requests.
double median_round_trip_us(caf::actor_system& system, const caf::actor& echo, int count) {
  caf::scoped_actor self{system};
  std::vector<double> samples;
  for (int i = 0; i < count + 100; ++i) {
    auto start = bench::now_seconds();
    self->request(echo, 5s, i).receive([](int) {}, [](caf::error&) {});
    if (i >= 100)
      samples.push_back((bench::now_seconds() - start) * 1e6);
  }
  return bench::median(samples);
}

/// Two CAF nodes (this process is the coordinator), optionally over TLS.
class node_session {
public:
  explicit node_session(const std::optional<tls_options>& tls) {
    node_options options;
    options.name = "worker0";
    options.world_size = 2;
    options.listen_address = "127.0.0.1";
    if (tls)
      options.tls = *tls;
    auto started = node::start(options);
    if (!started)
      throw std::runtime_error(started.error().message());
    node_ = std::move(*started);
    std::vector<std::string> args{self_path(), "--child=node",
                                  fmt::format("--troupe.coordinator=127.0.0.1:{}", node_->port()),
                                  "--troupe.rank=1", "--troupe.world-size=2", "--troupe.name=worker1",
                                  "--troupe.listen-address=127.0.0.1"};
    if (tls) {
      args.push_back("--troupe.tls.certificate=" + tls->certificate);
      args.push_back("--troupe.tls.key=" + tls->key);
      args.push_back("--troupe.tls.ca=" + tls->ca_file);
    }
    child_ = std::make_unique<bench::peer_process>(args);
    auto line = child_->read_line(30'000).value_or("");
    if (!line.starts_with("READY"))
      throw std::runtime_error("node child did not start: " + line);
    auto echo = node_->spawn_remote(*place::parse("worker1/cpu/echo"), "echo");
    auto sink = node_->spawn_remote(*place::parse("worker1/cpu/sink"), "sink");
    if (!echo || !sink)
      throw std::runtime_error("remote spawn failed");
    echo_ = *echo;
    sink_ = *sink;
  }
  ~node_session() {
    echo_ = nullptr;
    sink_ = nullptr;
    child_.reset(); // says quit, waits, kills if needed
    node_->stop();
  }

  double round_trip_us(int count) { return median_round_trip_us(node_->system(), echo_, count); }

  /// One-way GB/s of tensor_messages through CAF (BASP, or TLS), four in
  /// flight, each acknowledged by the sink.
  double throughput_gbps(std::size_t bytes, int count) {
    caf::scoped_actor self{node_->system()};
    auto payload = payload_of(bytes);
    auto run = [&](int n) {
      int sent = 0, acked = 0;
      auto start = bench::now_seconds();
      auto send_one = [&] {
        self->send(sink_, tensor_message{{message_kind::forward_activation, 0, 0, 0, "sink"}, payload, 0});
        ++sent;
      };
      while (sent < std::min(n, 4))
        send_one();
      while (acked < n) {
        bool ok = true;
        self->receive([&](std::int64_t) { ++acked; },
                      caf::after(10s) >> [&] { ok = false; });
        if (!ok)
          throw std::runtime_error("no acknowledgement from the sink within 10 s");
        if (sent < n)
          send_one();
      }
      return bench::now_seconds() - start;
    };
    run(std::max(count / 10, 2));
    return double(bytes) * count / run(count) / 1e9;
  }

private:
  std::unique_ptr<node> node_;
  std::unique_ptr<bench::peer_process> child_;
  caf::actor echo_;
  caf::actor sink_;
};

/// The same round trip between two plain CAF systems, connected with CAF's
/// own publish/remote_actor: no guard, no preamble (the figure the guard is
/// compared with).
class unguarded_caf_session {
public:
  unguarded_caf_session() {
    configure_like_a_node(config_);
    system_ = std::make_unique<caf::actor_system>(config_);
    child_ = std::make_unique<bench::peer_process>(std::vector<std::string>{self_path(), "--child=caf"});
    auto line = child_->read_line(30'000).value_or("");
    if (!line.starts_with("READY "))
      throw std::runtime_error("CAF child did not start: " + line);
    auto port = static_cast<std::uint16_t>(std::stoi(line.substr(6)));
    auto echo = system_->middleman().remote_actor("127.0.0.1", port);
    if (!echo)
      throw std::runtime_error("remote_actor: " + system_->render(echo.error()));
    echo_ = *echo;
  }
  ~unguarded_caf_session() {
    echo_ = nullptr;
    child_.reset();
  }

  double round_trip_us(int count) { return median_round_trip_us(*system_, echo_, count); }

private:
  caf::actor_system_config config_;
  std::unique_ptr<caf::actor_system> system_;
  std::unique_ptr<bench::peer_process> child_;
  caf::actor echo_;
};

/// Two nodes on this host through their tensor_routers (the user's path):
/// worker0 here sends to worker1's acker in a child process, which answers
/// every tensor through its router.
class router_session {
public:
  /// How the tensors are made and sent.
  enum class mode { arena, heap_ucx, heap_copy };

  router_session() {
    node_options options;
    options.name = "worker0";
    options.world_size = 2;
    options.listen_address = "127.0.0.1";
    auto started = node::start(options);
    if (!started)
      throw std::runtime_error(started.error().message());
    node_ = std::move(*started);
    child_ = std::make_unique<bench::peer_process>(std::vector<std::string>{
        self_path(), "--child=node", fmt::format("--troupe.coordinator=127.0.0.1:{}", node_->port()),
        "--troupe.rank=1", "--troupe.world-size=2", "--troupe.name=worker1", "--troupe.listen-address=127.0.0.1"});
    auto line = child_->read_line(30'000).value_or("");
    if (!line.starts_with("READY"))
      throw std::runtime_error("node child did not start: " + line);
    acks_ = node_->system().spawn([this]() -> caf::behavior {
      return {[this](const tensor_message& m) {
        std::lock_guard guard(mutex_);
        ++acked_;
        samples_.push_back({m.meta.step, m.meta.context_id});
        cv_.notify_all();
      }};
    });
    if (!node_->register_actor(*place::parse("worker0/cpu/acks"), acks_))
      throw std::runtime_error("cannot register worker0/cpu/acks");
    if (!node_->spawn_remote(*place::parse("worker1/cpu/acker"), "acker"))
      throw std::runtime_error("remote spawn of the acker failed");
  }
  ~router_session() {
    caf::anon_send_exit(acks_, caf::exit_reason::user_shutdown);
    acks_ = nullptr;
    slots_.clear();
    child_.reset();
    node_->stop();
  }

  tensor_router& router() { return *node_->router(); }

  /// One-way GB/s of `count` tensors of `bytes`, four in flight, each
  /// acknowledged by the acker; `wrong` counts acks whose byte sample
  /// differs from what was sent.
  double throughput_gbps(mode how, std::size_t bytes, int count, int& wrong) {
    auto& r = router();
    r.set_copy_into_arena_min_bytes(how == mode::heap_copy ? 0 : SIZE_MAX);
    slots_.clear();
    for (int i = 0; i < 4; ++i) {
      tensor t;
      if (how == mode::arena) {
        auto a = r.arena_tensor({static_cast<std::int64_t>(bytes)}, dtype::uint8);
        if (!a)
          throw std::runtime_error(a.error().to_string());
        t = *a;
      } else {
        t = tensor::empty({static_cast<std::int64_t>(bytes)}, dtype::uint8);
      }
      auto* p = static_cast<unsigned char*>(t.raw_data());
      for (std::size_t k = 0; k < bytes; ++k)
        p[k] = static_cast<unsigned char>((k >> 12) * 7 + static_cast<std::size_t>(i));
      slots_.push_back(t);
    }
    std::vector<std::uint64_t> expected_sample;
    for (auto& t : slots_) {
      std::uint64_t sample = 0;
      auto* p = static_cast<const unsigned char*>(t.raw_data());
      for (std::size_t i = 0; i < 64; ++i)
        sample = sample * 31 + p[i * (bytes - 1) / 63];
      expected_sample.push_back(sample);
    }
    auto to = *place::parse("worker1/cpu/acker");
    auto run = [&](int n) {
      {
        std::lock_guard guard(mutex_);
        acked_ = 0;
        samples_.clear();
      }
      auto start = bench::now_seconds();
      for (int sent = 0; sent < n; ++sent) {
        std::unique_lock lock(mutex_);
        if (!cv_.wait_for(lock, 10s, [&] { return sent - acked_ < 4; }))
          throw std::runtime_error("no acknowledgement within 10 s");
        lock.unlock();
        tensor_message m{{message_kind::forward_activation, static_cast<std::uint64_t>(sent), 0, 0, ""},
                         slots_[static_cast<std::size_t>(sent) % 4], 0};
        while (!r.send(to, m))
          std::this_thread::sleep_for(20us); // back-pressure
      }
      std::unique_lock lock(mutex_);
      if (!cv_.wait_for(lock, 10s, [&] { return acked_ == n; }))
        throw std::runtime_error("no acknowledgement within 10 s");
      auto seconds = bench::now_seconds() - start;
      for (auto [step, sample] : samples_)
        wrong += sample != expected_sample[step % 4];
      return seconds;
    };
    run(2);
    auto gbps = double(bytes) * count / run(count) / 1e9;
    slots_.clear();
    return gbps;
  }

private:
  std::unique_ptr<node> node_;
  std::unique_ptr<bench::peer_process> child_;
  caf::actor acks_;
  std::vector<tensor> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int acked_ = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> samples_;
};

/// Tensor messages per second between two actors in one process, and
/// whether the receiver saw the sender's memory (no copy).
std::pair<double, bool> in_process_rate(std::size_t bytes, int count) {
  caf::actor_system_config config;
  add_message_types(config);
  caf::actor_system system{config};
  auto payload = payload_of(bytes);
  auto same_memory = std::make_shared<std::atomic<bool>>(true);
  auto expected_data = payload.raw_data();
  auto receiver = system.spawn([=](caf::event_based_actor*) -> caf::behavior {
    return {[=](const tensor_message& m) {
      if (m.value.raw_data() != expected_data)
        *same_memory = false;
      return std::int64_t{1};
    }};
  });
  double seconds = 0;
  {
    caf::scoped_actor self{system};
    auto start = bench::now_seconds();
    int acked = 0;
    for (int i = 0; i < count; ++i)
      self->send(receiver, tensor_message{{message_kind::forward_activation, 0, 0, 0, "r"}, payload, 0});
    while (acked < count)
      self->receive([&](std::int64_t) { ++acked; });
    seconds = bench::now_seconds() - start;
  }
  caf::anon_send_exit(receiver, caf::exit_reason::user_shutdown);
  return {count / seconds, same_memory->load()};
}

std::string human(std::size_t bytes) {
  if (bytes >= (1 << 20))
    return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1 << 10))
    return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

int parent(int argc, char** argv) {
  bench::check_flags("transport", argc, argv, {"quick", "no-peers", "only=", "rounds="});
  bench::report out("transport", argc, argv);
  bool quick = false, peers = true;
  std::string only;
  int rounds = 0;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg(argv[i]);
    quick |= arg == "--quick";
    peers &= arg != "--no-peers";
    if (arg.starts_with("--only="))
      only = std::string(arg.substr(7));
  }
  rounds = static_cast<int>(bench::int_option(argc, argv, "rounds", 0, 0, 1000));
  auto section = [&](std::string_view name) {
    return only.empty() || ("," + only + ",").find(fmt::format(",{},", name)) != std::string::npos;
  };
  if (rounds <= 0)
    rounds = quick ? 5 : 11;
  auto cases = throughput_cases(quick);
  int port = 20000 + static_cast<int>(::getpid() % 20000);
  int rtt_count = quick ? 500 : 2000;

  // PyTorch first: its shared-memory transport busy-polls a core, so it
  // must not overlap anything else.
  std::map<std::string, double> torch;
  if (peers && (section("control") || section("plane") || section("samehost") || section("rtt"))) {
    auto script = std::string(TROUPE_SOURCE_DIR) + "/bench/peers/rpc_latency.py";
    if (std::filesystem::exists(script) && std::filesystem::exists("/usr/bin/python3"))
      torch = bench::pytorch_rpc(script, "default,uv");
    if (torch.empty())
      out.note("PyTorch RPC peer unavailable ({} and python3-torch needed)", script);
  }
  auto torch_figure = [&](const std::string& key) -> std::optional<double> {
    auto it = torch.find(key);
    return it == torch.end() ? std::nullopt : std::optional<double>(it->second);
  };

  // In process: the same cost at 64 B and 64 MiB (a reference count).
  for (std::size_t bytes : {std::size_t{64}, std::size_t{64} << 20}) {
    if (!section("inprocess"))
      break;
    auto [rate, same] = in_process_rate(bytes, quick ? 20000 : 100000);
    out.add({fmt::format("in process, {}", human(bytes)), "messages/s", rate, "msg/s", "", {},
             same ? "receiver saw the sender's memory" : "WRONG: copied"});
  }

  // Only the data-plane round trip over tcp, alternated with PyTorch's
  // figure from the start of this run (for profiling the round trip).
  if (!only.empty() && section("rtt")) {
    std::vector<double> rtts;
    for (int round = 0; round < rounds; ++round)
      rtts.push_back(plane_session("tcp").round_trip_us(rtt_count));
    out.add({"data plane RTT (tcp), sessions", "round trip", bench::median(rtts), "us", "PyTorch rpc_sync (uv)",
             torch_figure("rtt/uv"), fmt::format("median of {} sessions", rounds)});
  }

  // Control plane (CAF between two processes).
  if (section("control")) {
    node_session caf_plain(std::nullopt);
    auto rtt = caf_plain.round_trip_us(rtt_count);
    out.add({"control plane RTT (CAF)", "round trip", rtt, "us", "PyTorch rpc_sync (uv)", torch_figure("rtt/uv"), ""});
    // The guard is out of the path once a connection is handed over: the
    // guarded round trip against CAF's own publish/remote_actor, sessions
    // alternated, the ratio per round.
    {
      unguarded_caf_session unguarded;
      std::vector<double> guarded_us, unguarded_us, ratios;
      for (int round = 0; round < rounds; ++round) {
        bool guarded_first = round % 2 == 0;
        double g = 0, u = 0;
        if (guarded_first)
          g = caf_plain.round_trip_us(rtt_count / 2);
        u = unguarded.round_trip_us(rtt_count / 2);
        if (!guarded_first)
          g = caf_plain.round_trip_us(rtt_count / 2);
        guarded_us.push_back(g);
        unguarded_us.push_back(u);
        ratios.push_back(g / u);
      }
      std::sort(ratios.begin(), ratios.end());
      out.add({"control plane RTT, guarded (troupe)", "round trip", bench::median(guarded_us), "us",
               "CAF publish/remote_actor, no guard", bench::median(unguarded_us),
               fmt::format("{} rounds alternated; guarded/unguarded median {:.3f}, range {:.3f}-{:.3f}", rounds,
                           bench::median(ratios), ratios.front(), ratios.back())});
    }
    for (auto [bytes, count] : cases) {
      out.add({fmt::format("CAF remote, {}", human(bytes)), "throughput", caf_plain.throughput_gbps(bytes, count / 2 + 2),
               "GB/s", "", {}, "tensor_message through CAF (BASP)"});
    }
  }

  // Data plane over TCP and shared memory, beside ucx_perftest. This machine's
  // speed drifts 2x within a minute, so one figure each says little: ours and
  // ucx_perftest's alternate, `rounds` times per case (order flipped every
  // round), and the note gives the median of the per-round ratios and their
  // range.
  for (std::string transports : {"tcp", "sm,self"}) {
    if (!section("plane"))
      break;
    plane_session session(transports);
    session.throughput_gbps(1 << 20, 50); // warm-up: connections, buffers
    auto compare = [&](const std::string& name, const std::string& metric, const std::string& unit,
                       const std::string& peer, auto&& ours, auto&& theirs) {
      std::vector<double> mine, peer_figures, ratios;
      for (int round = 0; round < rounds; ++round) {
        std::optional<double> t;
        if (round % 2 == 0) {
          mine.push_back(ours());
          t = peers ? theirs() : std::nullopt;
        } else {
          t = peers ? theirs() : std::nullopt;
          mine.push_back(ours());
        }
        if (t) {
          peer_figures.push_back(*t);
          ratios.push_back(mine.back() / *t);
        }
      }
      std::optional<double> peer_median;
      std::string note = fmt::format("median of {} interleaved rounds", rounds);
      if (!peer_figures.empty()) {
        peer_median = bench::median(peer_figures);
        auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
        note += fmt::format("; per-round ratio median {:.2f}, range {:.2f}-{:.2f}", bench::median(ratios), *lo, *hi);
      }
      out.add({name, metric, bench::median(mine), unit, peer, peer_median, note});
    };
    compare(fmt::format("data plane RTT ({})", transports), "round trip", "us", "ucx_perftest ucp_am_lat",
            [&] { return session.round_trip_us(rtt_count); },
            [&] { return bench::ucx_perftest({.transports = transports, .test = "ucp_am_lat", .bytes = 64,
                                                 .iterations = 2000, .window = 1, .port = port++}); });
    if (transports == "sm,self")
      out.add({"data plane RTT (sm,self)", "round trip", out.last().value, "us", "PyTorch rpc_sync (default)",
               torch_figure("rtt/default"), "both over shared memory"});
    if (transports == "tcp") {
      // PyTorch's figures come from the start of this run (its shared-memory
      // transport busy-polls a core, so it cannot alternate with ours).
      auto rtt = out.last().value;
      // What the transport thread's short poll before sleeping buys
      // (data_plane_options::spin_before_sleep): the same, never polling.
      plane_session sleeper(transports, std::chrono::microseconds(0));
      compare("data plane RTT (tcp)", "round trip", "us", "same, data-plane-spin 0 (sleep at once)",
              [&] { return session.round_trip_us(rtt_count); },
              [&] { return std::optional<double>(sleeper.round_trip_us(rtt_count)); });
      out.add({"data plane RTT (tcp)", "round trip", rtt, "us", "PyTorch rpc_sync (uv)", torch_figure("rtt/uv"), ""});
      out.add({"data plane RTT (tcp)", "round trip", rtt, "us", "PyTorch rpc_sync (default)",
               torch_figure("rtt/default"), "PyTorch's default is shared memory on one host: compare the sm row"});
    }
    for (auto [bytes, count] : cases) {
      auto against_perftest = [&](const std::string& wait_mode, bool written) {
        bench::perftest_options o{.transports = transports, .test = "ucp_am_bw", .bytes = bytes,
                                  .iterations = count, .window = 4, .wait_mode = wait_mode};
        if (written)
          o.written_buffers_shim = TROUPE_PERFTEST_SHIM;
        auto peer = fmt::format("ucx_perftest ucp_am_bw -O 4{}{}", wait_mode == "sleep" ? " -E sleep" : "",
                                written ? ", buffers written" : "");
        compare(fmt::format("data plane {}, {}", transports, human(bytes)), "throughput", "GB/s", peer,
                [&] { return session.throughput_gbps(bytes, count); },
                [&] {
                  o.port = port++;
                  return bench::ucx_perftest(o);
                });
      };
      against_perftest("poll", false);
      // Like for like, over tcp where the target is set: perftest waiting on
      // its event fd when idle, as our transport thread must (it may not spin
      // a core while idle), and perftest sending memory that holds data, as
      // a tensor does.
      if (transports == "tcp" && bytes >= (1 << 20)) {
        against_perftest("sleep", false);
        against_perftest("poll", true);
        against_perftest("sleep", true);
      }
      if (transports == "sm,self" && bytes >= (16 << 20)) {
        auto ours = out.last().value;
        out.add({fmt::format("data plane {}, {}", transports, human(bytes)), "throughput", ours, "GB/s",
                 "PyTorch rpc (default, shm)", torch_figure(fmt::format("send/default/{}", bytes)), ""});
      }
    }
    if (transports == "sm,self") {
      for (auto [bytes, count] : cases) {
        auto rate = session.arena_gbps(bytes, count);
        out.add({fmt::format("shared arena, {}", human(bytes)), "throughput", rate, "GB/s",
                 "PyTorch rpc (default, shm)", torch_figure(fmt::format("send/default/{}", bytes)),
                 fmt::format("by reference, no copy: {:.1f} us per handoff + release", bytes / rate / 1e3)});
      }
    }
  }

  // Same host through the tensor_router (what user code does): an arena
  // tensor goes by reference, a heap tensor through UCX (shared memory or
  // CMA, UCX's choice) or copied into the arena. Modes interleaved in every
  // round, the order rotated; medians of `rounds`.
  if (section("samehost")) {
    router_session session;
    using mode = router_session::mode;
    const std::pair<mode, const char*> modes[] = {
        {mode::arena, "arena tensor (by reference)"}, {mode::heap_ucx, "heap tensor, UCX"},
        {mode::heap_copy, "heap tensor, copied into the arena"}};
    for (auto [bytes, count] : {sizes_and_counts{64 << 10, quick ? 200 : 1000}, sizes_and_counts{256 << 10, quick ? 100 : 400},
                                sizes_and_counts{1 << 20, quick ? 50 : 200}, sizes_and_counts{16 << 20, quick ? 10 : 30},
                                sizes_and_counts{64 << 20, quick ? 4 : 10}}) {
      std::vector<double> figures[3];
      int wrong[3] = {0, 0, 0};
      for (int round = 0; round < rounds; ++round)
        for (int k = 0; k < 3; ++k) {
          auto m = static_cast<std::size_t>((k + round) % 3);
          figures[m].push_back(session.throughput_gbps(modes[m].first, bytes, count, wrong[m]));
        }
      auto torch_send = torch_figure(fmt::format("send/default/{}", bytes));
      for (std::size_t m = 0; m < 3; ++m) {
        auto sorted = figures[m];
        std::sort(sorted.begin(), sorted.end());
        auto note = fmt::format("{}; median of {} interleaved rounds, range {:.2f}-{:.2f}{}", modes[m].second,
                                rounds, sorted.front(), sorted.back(),
                                wrong[m] ? fmt::format(", WRONG: {} tensors damaged", wrong[m]) : "");
        out.add({fmt::format("same host, router, {}, {}", m == 0 ? "arena" : m == 1 ? "heap/ucx" : "heap/copy",
                             human(bytes)),
                 "throughput", bench::median(figures[m]), "GB/s", "PyTorch rpc (default, shm)", torch_send, note});
      }
      // Which heap path the router should pick at this size (per-round ratio).
      std::vector<double> copy_over_ucx;
      for (int round = 0; round < rounds; ++round)
        copy_over_ucx.push_back(figures[2][static_cast<std::size_t>(round)] / figures[1][static_cast<std::size_t>(round)]);
      out.note("same host, {}: heap tensor copied into the arena / through UCX = {:.2f} (median of {} rounds)",
               human(bytes), bench::median(copy_over_ucx), rounds);
    }
    auto stats = session.router().stats();
    out.note("same host: router sent {} by reference ({} copied into the arena, {} fell back to UCX), {} over UCX",
             stats.arena_sends, stats.arena_copies, stats.arena_fallbacks, stats.data_plane_sends);
  }

  // Tracing: data-plane throughput with both processes recording (send,
  // receive and transfer records) or not, toggled inside one session so both
  // see the same processes and connections; traced and untraced rounds
  // alternate (order flipped every round) and the figure is the median of
  // the per-round ratios. The bound: at most 5% slower.
  if (section("tracing")) {
    auto dir = std::filesystem::temp_directory_path() / fmt::format("troupe-bench-trace-{}", ::getpid());
    plane_session session("tcp");
    int trace_rounds = std::max(rounds, quick ? 9 : 41);
    for (auto [bytes, count] : {sizes_and_counts{4 << 10, quick ? 2000 : 5000},
                                sizes_and_counts{1 << 20, quick ? 100 : 200}}) {
      std::vector<double> plain, traced, ratio;
      session.throughput_gbps(bytes, count); // warm-up
      for (int round = 0; round < trace_rounds; ++round) {
        auto measure_plain = [&] { plain.push_back(session.throughput_gbps(bytes, count)); };
        auto measure_traced = [&] {
          session.set_tracing((dir / std::to_string(round)).string());
          traced.push_back(session.throughput_gbps(bytes, count));
          session.set_tracing({});
        };
        if (round % 2) {
          measure_traced();
          measure_plain();
        } else {
          measure_plain();
          measure_traced();
        }
        ratio.push_back(traced.back() / plain.back());
      }
      auto sorted = ratio;
      std::sort(sorted.begin(), sorted.end());
      // A distribution-free 95% confidence interval of the median: the
      // order statistics n/2 -+ 0.98 sqrt(n) (normal approximation of the
      // binomial), clamped to the sample.
      auto n = static_cast<double>(sorted.size());
      auto lo = static_cast<std::size_t>(std::max(0.0, std::floor(n / 2 - 0.98 * std::sqrt(n))));
      auto hi = static_cast<std::size_t>(std::min(n - 1, std::ceil(n / 2 + 0.98 * std::sqrt(n)) - 1));
      auto records = trace::stats().records;
      out.add({fmt::format("tracing on, data plane tcp, {}", human(bytes)), "throughput", bench::median(traced),
               "GB/s", "tracing off", bench::median(plain),
               fmt::format("median traced/untraced ratio of {} interleaved round pairs {:.3f} (95% CI of the median "
                           "{:.3f}-{:.3f}, range {:.3f}-{:.3f}); {} records in the last traced round",
                           trace_rounds, bench::median(ratio), sorted[lo], sorted[hi], sorted.front(), sorted.back(),
                           records)});
    }
    std::filesystem::remove_all(dir);
  }

  // Mutual TLS: the price of encryption on the tensor path.
  if (section("tls")) {
    auto dir = std::filesystem::temp_directory_path() / fmt::format("troupe-bench-certs-{}", ::getpid());
    auto made = std::system(fmt::format("sh {}/scripts/make_test_certs.sh {} >/dev/null 2>&1", TROUPE_SOURCE_DIR,
                                        dir.string()).c_str());
    if (made != 0) {
      out.note("could not create test certificates; TLS rows skipped");
    } else {
      tls_options tls{(dir / "node.pem").string(), (dir / "node.key").string(), (dir / "ca.pem").string(), ""};
      node_session caf_tls(tls);
      out.add({"control plane RTT (CAF, TLS)", "round trip", caf_tls.round_trip_us(rtt_count), "us", "", {}, ""});
      for (auto [bytes, count] : cases) {
        out.add({fmt::format("TLS (CAF + OpenSSL), {}", human(bytes)), "throughput",
                 caf_tls.throughput_gbps(bytes, count / 2 + 2), "GB/s", "", {}, "mutual TLS, encrypted"});
      }
    }
    std::filesystem::remove_all(dir);
  }
  out.print();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg(argv[i]);
    if (arg == "--child=plane") {
      std::string transports;
      std::chrono::microseconds spin = data_plane_options{}.spin_before_sleep;
      for (int j = 1; j < argc; ++j) {
        std::string_view a(argv[j]);
        if (a.starts_with("--transports="))
          transports = std::string(a.substr(13));
        if (a.starts_with("--spin-us="))
          spin = std::chrono::microseconds(std::atoi(argv[j] + 10));
      }
      return child_plane(transports, spin);
    }
    if (arg == "--child=node")
      return child_node(argc, argv);
    if (arg == "--child=caf")
      return child_unguarded_caf();
  }
  try {
    return parent(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "transport: {}\n", e.what());
    return 1;
  }
}
