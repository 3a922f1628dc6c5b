// A three-process topology of hand-written actors: a producer on rank 0
// streams activation batches to a compute actor on rank 1 (a dense layer, relu(x W), on its own thread),
// which sends the results to a sink on rank 2; the sink acknowledges each
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

#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/job.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono;

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto batches = job.flag("batches", 200, 1, 1'000'000);
  const auto width = job.flag("width", 512, 1, 8192);
  const auto credits = job.flag("credits", 4, 1, 256);
  job.start();
  if (job.world_size() < 3)
    job.fail(make_error(errc::invalid_argument, "needs 3 processes (troupe-launch -n 3), not {}", job.world_size()));
  if (job.rank() > 2)
    return job.serve();
  auto& n = job.node();
  auto router = n.router();
  const auto total = static_cast<std::uint64_t>(batches);
  const place stage[3] = {*place::parse(job.places()[0] + "/producer"), *place::parse(job.places()[1] + "/compute"),
                          *place::parse(job.places()[2] + "/sink")};
  const auto& self_place = stage[job.rank()];
  const auto& next = stage[(job.rank() + 1) % 3]; // the sink's acks go back to the producer
  auto name = trace::intern(self_place.to_string());
  std::promise<void> acked; // the producer: every batch acknowledged
  std::atomic<std::uint64_t> handled{0}, sent{0};
  double busy_ms = 0, last_mean = 0;
  auto input = randn({64, width}, default_generator());
  auto weight = mul(randn({width, width}, default_generator()), 1.0 / std::sqrt(static_cast<double>(width)));
  auto forward = [&](std::uint64_t step, tensor value, message_kind kind) {
    tensor_message m{{kind, step, 0, 0, {}, 0, 0}, std::move(value), 0};
    if (auto ok = router->send(next, std::move(m), {}, name); !ok)
      fmt::print(stderr, "{}: {}\n", self_place.to_string(), ok.error().message());
  };
  auto behaviour = [&]() -> caf::behavior {
    return {[&](const tensor_message& m) {
      tensor_receive_scope scope(name, m);
      const auto count = ++handled;
      if (job.rank() == 0) { // an ack: one more credit
        if (auto i = sent.fetch_add(1); i < total) forward(i, input, message_kind::forward_activation);
        if (count == total) acked.set_value();
      } else if (job.rank() == 1) { // the dense layer, then on to the sink
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
  // Compute runs detached (its own thread): heavy work never blocks the
  // scheduler. The node keeps the handle and stops the actor with itself
  // (a handle kept here would keep a detached actor's thread alive).
  job.must(n.register_actor(self_place, job.rank() == 1 ? n.system().spawn<caf::detached>(behaviour)
                                                        : n.system().spawn(behaviour)),
           self_place.to_string());

  if (job.rank() != 0) {
    // Compute and sink answer what arrives until the producer finishes the job.
    const int status = job.serve();
    if (job.rank() == 1)
      fmt::print("compute: {} batches of relu([64, {}] x [{}, {}]), busy {:.1f} ms ({:.1f} us each)\n",
                 handled.load(), width, width, width, busy_ms, 1e3 * busy_ms / static_cast<double>(handled.load()));
    else
      fmt::print("sink: {} batches received, {} acked, last mean {:.4f}\n", handled.load(), handled.load(), last_mean);
    return status;
  }
  // The producer starts once every stage is registered: a tensor for a
  // place nobody has registered yet is dropped by the receiving router.
  for (const auto& p : stage)
    job.must(n.await_actor(p, 30s), "producer");
  const auto t0 = steady_clock::now();
  for (std::int64_t c = 0; c < credits; ++c)
    if (auto i = sent.fetch_add(1); i < total) forward(i, input, message_kind::forward_activation);
  if (acked.get_future().wait_for(120s) != std::future_status::ready)
    job.fail(make_error(errc::io_error, "timed out after {} of {} batches", handled.load(), total), "producer");
  const double ms = duration<double, std::milli>(steady_clock::now() - t0).count();
  fmt::print("producer: {} batches of [64, {}] float32 in {:.1f} ms ({:.1f} batches/s), at most {} in flight\n",
             total, width, ms, 1e3 * static_cast<double>(total) / ms, credits);
  return job.finish(0); // releases the other ranks and stops every registered actor
}
