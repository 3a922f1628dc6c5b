// Ping-pong between two processes: worker0 bounces a tensor off a pong actor
// on worker1 and prints round-trip latency and throughput. The actors only
// call router->send(place, message); the tensor crosses over the UCX data
// plane (over CAF's TLS connection with --troupe.tls.*), and arrives as an
// ordinary CAF message.
//
//   build/bin/troupe-launch -n 2 -- build/examples/ping_pong --rounds=1000 --bytes=1048576
//
// prints (rank 0; figures from a 2-core machine, UCX's choice of transport):
//   [0] ping_pong: 1000 rounds of 1048576 bytes, worker0 <-> worker1/cpu/pong
//   [0] round trip us: p50 311.0  p90 368.8  p99 498.6
//   [0] throughput: 6.66 GB/s (both directions)
//
// With TROUPE_TRACE_DIR=/tmp/pp both processes write a trace:
//   build/bin/troupe-trace summary /tmp/pp
#include <algorithm>
#include <condition_variable>
#include <future>
#include <mutex>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "command_line.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_router.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono;

int main(int argc, char** argv) {
  examples::command_line cl(argc, argv);
  auto rounds = cl.integer("rounds", 1000, 1, 10'000'000);
  auto bytes = cl.integer("bytes", 1 << 20, 4, std::int64_t{1} << 30);
  auto options = node_options::from(argc, argv);
  auto rest = cl.finish();
  for (const troupe::error* e : {rounds ? nullptr : &rounds.error(), bytes ? nullptr : &bytes.error(),
                                 options ? nullptr : &options.error(), rest ? nullptr : &rest.error()})
    if (e) { fmt::print(stderr, "ping_pong: {}\n", e->message()); return 2; }
  auto started = node::start(*options);
  if (!started) { fmt::print(stderr, "ping_pong: {}\n", started.error().message()); return 1; }
  auto& n = **started;
  auto router = n.router();
  const auto ping = *place::parse("worker0/cpu/ping"), pong = *place::parse("worker1/cpu/pong");
  if (n.rank() == 1) {
    // pong: send every tensor straight back; a control message ends the run.
    std::promise<void> finished;
    auto name = trace::intern(pong.to_string());
    auto actor = n.system().spawn([&, name]() -> caf::behavior {
      return {[&, name](const tensor_message& m) {
        tensor_receive_scope scope(name, m);
        if (m.meta.kind == message_kind::control) return finished.set_value();
        tensor_message back{m.meta, m.value, 0};
        if (auto ok = router->send(ping, std::move(back), {}, name); !ok)
          fmt::print(stderr, "pong: {}\n", ok.error().message());
      }};
    });
    (void)n.register_actor(pong, actor);
    finished.get_future().wait_for(120s);
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    n.stop();
    return 0;
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
  (void)n.register_actor(ping, actor);
  if (auto found = n.await_actor(pong, 30s); !found) { // until worker1 has registered pong
    fmt::print(stderr, "ping: {}\n", found.error().message());
    return 1;
  }
  auto value = tensor::ones({*bytes / 4});
  const std::int64_t warmup = std::min<std::int64_t>(10, *rounds);
  std::vector<double> micros;
  auto begin = steady_clock::now();
  for (std::int64_t i = 0; i < warmup + *rounds; ++i) {
    if (i == warmup) begin = steady_clock::now();
    auto t0 = steady_clock::now();
    tensor_message m{{message_kind::forward_activation, static_cast<std::uint64_t>(i), 0, 0, {}, 0, 0}, value, 0};
    if (auto ok = router->send(pong, std::move(m), {}, name); !ok) {
      fmt::print(stderr, "ping: {}\n", ok.error().message());
      return 1;
    }
    std::unique_lock guard(mutex);
    if (!arrived.wait_for(guard, 10s, [&] { return replies == static_cast<std::uint64_t>(i + 1); })) {
      fmt::print(stderr, "ping: no reply to round {} within 10 s\n", i);
      return 1;
    }
    if (i >= warmup) micros.push_back(duration<double, std::micro>(steady_clock::now() - t0).count());
  }
  double seconds = duration<double>(steady_clock::now() - begin).count();
  std::sort(micros.begin(), micros.end());
  auto pct = [&](double p) { return micros[static_cast<std::size_t>(p * static_cast<double>(micros.size() - 1))]; };
  fmt::print("ping_pong: {} rounds of {} bytes, worker0 <-> {}\n", *rounds, *bytes / 4 * 4, pong.to_string());
  fmt::print("round trip us: p50 {:.1f}  p90 {:.1f}  p99 {:.1f}\n", pct(0.5), pct(0.9), pct(0.99));
  fmt::print("throughput: {:.2f} GB/s (both directions)\n", 2.0 * static_cast<double>(*rounds * (*bytes / 4 * 4)) / seconds / 1e9);
  std::fflush(stdout);
  std::promise<void> sent; // the stop message must leave before this node does
  tensor_message stop{{message_kind::control, 0, 0, 0, {}, 0, 0}, tensor::zeros({1}), 0};
  if (router->send(pong, std::move(stop), [&](expected<void>) { sent.set_value(); }, name))
    sent.get_future().wait_for(5s);
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  n.stop();
  return 0;
}
