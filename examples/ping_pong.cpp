// Ping-pong between two processes: rank 0 bounces a tensor off a pong actor
// on rank 1 and prints round-trip latency and throughput. The actors only
// call router->send(place, message); the tensor crosses over the UCX data
// plane (over the control plane's TLS connection with --troupe.tls.*), and
// arrives as an ordinary actor message.
//
//   build/bin/troupe-launch -n 2 -- build/examples/ping_pong --rounds=1000 --bytes=1048576
//
// prints (rank 0; figures from a 2-core machine, UCX's choice of transport):
//   [0] ping_pong: 1000 rounds of 1048576 bytes, worker0/cpu/ping <-> worker1/cpu/pong
//   [0] round trip us: p50 311.0  p90 368.8  p99 498.6
//   [0] throughput: 6.66 GB/s (both directions)
//
// With TROUPE_TRACE_DIR=/tmp/pp both processes write a trace:
//   build/bin/troupe-trace summary /tmp/pp
#include <algorithm>
#include <condition_variable>
#include <mutex>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/job.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono;

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto rounds = job.flag("rounds", 1000, 1, 10'000'000);
  const auto bytes = job.flag("bytes", 1 << 20, 4, std::int64_t{1} << 30);
  job.start();
  if (job.world_size() < 2)
    job.fail(make_error(errc::invalid_argument, "needs 2 processes (troupe-launch -n 2), not {}", job.world_size()));
  auto& n = job.node();
  auto router = n.router();
  const auto ping = *place::parse(job.places()[0] + "/ping"), pong = *place::parse(job.places()[1] + "/pong");

  if (job.rank() > 1)
    return job.serve();
  if (job.rank() == 1) {
    // pong: every tensor goes straight back; it serves until rank 0 finishes.
    auto name = trace::intern(pong.to_string());
    auto actor = n.system().spawn([router, ping, name]() -> caf::behavior {
      return {[router, ping, name](const tensor_message& m) {
        tensor_receive_scope scope(name, m);
        if (auto ok = router->send(ping, tensor_message{m.meta, m.value, 0}, {}, name); !ok)
          fmt::print(stderr, "pong: {}\n", ok.error().message());
      }};
    });
    job.must(n.register_actor(pong, actor), "pong");
    return job.serve();
  }

  // ping: the main thread drives, an actor hands each reply over.
  std::mutex mutex;
  std::condition_variable arrived;
  std::uint64_t replies = 0;
  auto name = trace::intern(ping.to_string());
  auto actor = n.system().spawn([&, name]() -> caf::behavior {
    return {[&, name](const tensor_message& m) {
      tensor_receive_scope scope(name, m);
      std::lock_guard guard(mutex);
      ++replies;
      arrived.notify_one();
    }};
  });
  job.must(n.register_actor(ping, actor), "ping");
  job.must(n.await_actor(pong, 30s), "ping"); // until rank 1 has registered pong
  auto value = tensor::ones({bytes / 4});
  const std::int64_t warmup = std::min<std::int64_t>(10, rounds);
  std::vector<double> micros;
  auto begin = steady_clock::now();
  for (std::int64_t i = 0; i < warmup + rounds; ++i) {
    if (i == warmup) begin = steady_clock::now();
    auto t0 = steady_clock::now();
    tensor_message m{{message_kind::forward_activation, static_cast<std::uint64_t>(i), 0, 0, {}, 0, 0}, value, 0};
    job.must(router->send(pong, std::move(m), {}, name), "ping");
    std::unique_lock guard(mutex);
    if (!arrived.wait_for(guard, 10s, [&] { return replies == static_cast<std::uint64_t>(i + 1); }))
      job.fail(make_error(errc::io_error, "no reply to round {} within 10 s", i), "ping");
    if (i >= warmup) micros.push_back(duration<double, std::micro>(steady_clock::now() - t0).count());
  }
  const double seconds = duration<double>(steady_clock::now() - begin).count();
  std::sort(micros.begin(), micros.end());
  auto pct = [&](double p) { return micros[static_cast<std::size_t>(p * static_cast<double>(micros.size() - 1))]; };
  fmt::print("ping_pong: {} rounds of {} bytes, {} <-> {}\n", rounds, bytes / 4 * 4, ping.to_string(),
             pong.to_string());
  fmt::print("round trip us: p50 {:.1f}  p90 {:.1f}  p99 {:.1f}\n", pct(0.5), pct(0.9), pct(0.99));
  fmt::print("throughput: {:.2f} GB/s (both directions)\n",
             2.0 * static_cast<double>(rounds * (bytes / 4 * 4)) / seconds / 1e9);
  return job.finish(0); // stops the node and the actors registered on it
}
