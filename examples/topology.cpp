// A three-node topology: a producer on worker0 streams activation batches to
// a compute actor on worker1 (a dense layer, relu(x W), on its own thread),
// which sends the results to a sink on worker2; the sink acknowledges each
// batch back to the producer, and the acks are the producer's credits (at
// most --credits batches in flight). Every hop is router->send(place, ...).
//
//   TROUPE_TRACE_DIR=/tmp/t build/bin/troupe-launch -n 3 -- build/examples/topology --batches=200
//   build/bin/troupe-trace summary /tmp/t && build/bin/troupe-trace svg -o /tmp/t.svg /tmp/t
//
// prints (figures from a 2-core machine):
//   [1] compute: 200 batches of relu([64, 512] x [512, 512]), busy 227.7 ms (1138.6 us each)
//   [2] sink: 200 batches received, 200 acked, last mean 0.4018
//   [0] producer: 200 batches of [64, 512] float32 in 237.2 ms (843.2 batches/s), at most 4 in flight
// and the summary shows three edges (producer -> compute -> sink -> producer),
// 200 messages each, all 200 matched send-to-receive.
#include <atomic>
#include <cmath>
#include <future>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "command_line.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono;

int main(int argc, char** argv) {
  examples::command_line cl(argc, argv);
  auto batches = cl.integer("batches", 200, 1, 1'000'000);
  auto width = cl.integer("width", 512, 1, 8192);
  auto credits = cl.integer("credits", 4, 1, 256);
  auto options = node_options::from(argc, argv);
  auto rest = cl.finish();
  for (const troupe::error* e : {batches ? nullptr : &batches.error(), width ? nullptr : &width.error(),
                                 credits ? nullptr : &credits.error(), options ? nullptr : &options.error(),
                                 rest ? nullptr : &rest.error()})
    if (e) { fmt::print(stderr, "topology: {}\n", e->message()); return 2; }
  auto started = node::start(*options);
  if (!started) { fmt::print(stderr, "topology: {}\n", started.error().message()); return 1; }
  auto& n = **started;
  auto router = n.router();
  const std::uint64_t total = static_cast<std::uint64_t>(*batches);
  const place stage[3] = {*place::parse("worker0/cpu/producer"), *place::parse("worker1/cpu/compute"),
                          *place::parse("worker2/cpu/sink")};
  const auto& self_place = stage[std::min<std::uint32_t>(n.rank(), 2)];
  const auto& next = stage[(n.rank() + 1) % 3]; // the sink's acks go back to the producer
  auto name = trace::intern(self_place.to_string());
  std::promise<void> finished;
  std::uint64_t handled = 0;
  double busy_ms = 0, last_mean = 0;
  std::atomic<std::uint64_t> sent{0};
  auto input = randn({64, *width}, default_generator());
  auto weight = mul(randn({*width, *width}, default_generator()), 1.0 / std::sqrt(static_cast<double>(*width)));
  auto forward = [&](std::uint64_t step, tensor value, message_kind kind) {
    tensor_message m{{kind, step, 0, 0, {}, 0, 0}, std::move(value), 0};
    bool last = n.rank() != 0 && handled == total; // done once the last one has left
    auto ok = router->send(next, std::move(m), [&, last](expected<void>) { if (last) finished.set_value(); }, name);
    if (!ok) fmt::print(stderr, "{}: {}\n", self_place.to_string(), ok.error().message());
  };
  auto behaviour = [&]() -> caf::behavior {
    return {[&](const tensor_message& m) {
      tensor_receive_scope scope(name, m);
      ++handled;
      if (n.rank() == 0) { // an ack: one more credit
        if (auto i = sent.fetch_add(1); i < total) forward(i, input, message_kind::forward_activation);
        if (handled == total) finished.set_value();
      } else if (n.rank() == 1) { // the dense layer, then on to the sink
        auto t0 = steady_clock::now();
        auto y = relu(matmul(m.value, weight));
        busy_ms += duration<double, std::milli>(steady_clock::now() - t0).count();
        forward(m.meta.step, std::move(y), message_kind::forward_activation);
      } else { // sink: look at the result, acknowledge it
        last_mean = mean(m.value).item();
        forward(m.meta.step, tensor::zeros({1}), message_kind::control);
      }
    }};
  };
  // Compute runs detached (its own thread): heavy work never blocks CAF's scheduler.
  auto actor = n.rank() == 1 ? n.system().spawn<caf::detached>(behaviour) : n.system().spawn(behaviour);
  (void)n.register_actor(self_place, actor);
  // The producer starts only once every stage is registered: a tensor for a
  // place nobody has registered yet is dropped by the receiving node's
  // router. Only the producer waits; the others just answer what arrives
  // (were they to wait too, the job could be over, and the coordinator gone,
  // before they had finished).
  auto t0 = steady_clock::now();
  if (n.rank() == 0) {
    for (const auto& p : stage)
      if (auto found = n.await_actor(p, 30s); !found) {
        fmt::print(stderr, "producer: {}\n", found.error().message());
        return 1;
      }
    t0 = steady_clock::now();
    for (std::int64_t c = 0; c < *credits; ++c)
      if (auto i = sent.fetch_add(1); i < total) forward(i, input, message_kind::forward_activation);
  }
  bool done = finished.get_future().wait_for(120s) == std::future_status::ready;
  double ms = duration<double, std::milli>(steady_clock::now() - t0).count();
  caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  actor = nullptr; // a handle would keep the detached actor's thread, and n.stop(), waiting
  if (!done) { fmt::print(stderr, "{}: timed out after {} of {} batches\n", self_place.to_string(), handled, total); return 1; }
  if (n.rank() == 0)
    fmt::print("producer: {} batches of [64, {}] float32 in {:.1f} ms ({:.1f} batches/s), at most {} in flight\n",
               total, *width, ms, 1e3 * static_cast<double>(total) / ms, *credits);
  else if (n.rank() == 1)
    fmt::print("compute: {} batches of relu([64, {}] x [{}, {}]), busy {:.1f} ms ({:.1f} us each)\n", handled,
               *width, *width, *width, busy_ms, 1e3 * busy_ms / static_cast<double>(handled));
  else
    fmt::print("sink: {} batches received, {} acked, last mean {:.4f}\n", handled, handled, last_mean);
  std::fflush(stdout);
  n.stop();
  return 0;
}
