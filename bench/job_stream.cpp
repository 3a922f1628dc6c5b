// One-way stream of tensors from rank 0 to rank 1 over the data plane, the
// shape of `iperf3 -c`: the sender keeps --window tensors in flight for
// --seconds, the receiver answers each with a 4-byte acknowledgement, and
// the rate is the bytes the receiver got over the time from the first send
// to the last acknowledgement. bench/links.sh runs it beside iperf3 on the
// same link (examples/ping_pong times round trips instead, which leave each
// direction of the link idle half the time).
//
//   build/bin/troupe-launch -n 2 --hosts HOSTS -- build/bench/job_stream --bytes=4194304 --seconds=3
//
// Prints "stream: N tensors of B bytes ... Mbit/s" (or a JSON line with
// --json=yes); #wrong counts tensors whose size or values arrived changed.
// Exit 1 when any did.
#include <algorithm>
#include <chrono>
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

namespace {

tensor_message numbered(const tensor& value, std::uint64_t index) {
  return {{message_kind::forward_activation, index, 0, 0, {}, 0, 0}, value, 0};
}

} // namespace

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto bytes = job.flag("bytes", 4 << 20, 4, std::int64_t{1} << 30);
  const auto window = job.flag("window", 8, 1, 64);
  const auto seconds = job.flag("seconds", 3, 1, 600);
  const bool json = job.flag("json", "no", {"no", "yes"}) == "yes";
  if (bytes * window > std::int64_t{48} << 20)
    job.reject(fmt::format("--bytes={} times --window={} is above 48 MiB in flight (the data plane's credit window "
                           "is 64 MiB)",
                           bytes, window));
  job.start();
  if (job.world_size() < 2)
    job.fail(make_error(errc::invalid_argument, "needs 2 processes (troupe-launch -n 2), not {}", job.world_size()));
  auto& n = job.node();
  auto router = n.router();
  const auto source = *place::parse(job.places()[0] + "/source"), sink = *place::parse(job.places()[1] + "/sink");
  const auto count = bytes / 4;
  const float fill = 1.5f;

  if (job.rank() > 1)
    return job.serve();
  if (job.rank() == 1) {
    // sink: checks each tensor's size and its first and last values (a full
    // scan would cost this core as much as the copy it measures), answers.
    auto name = trace::intern(sink.to_string());
    auto ack = tensor::zeros({1});
    auto actor = n.system().spawn([router, source, name, ack, count, fill]() -> caf::behavior {
      return {[router, source, name, ack, count, fill](const tensor_message& m) {
        tensor_receive_scope scope(name, m);
        const bool intact = m.value.numel() == count && m.value.type() == dtype::float32 &&
                            m.value.data<float>()[0] == fill && m.value.data<float>()[count - 1] == fill;
        auto reply = numbered(ack, m.meta.step);
        reply.meta.micro_batch = intact ? 0 : 1;
        if (auto ok = router->send(source, std::move(reply), {}, name); !ok)
          fmt::print(stderr, "sink: {}\n", ok.error().message());
      }};
    });
    job.must(n.register_actor(sink, actor), "sink");
    return job.serve();
  }

  // source: the main thread sends while fewer than --window are unanswered.
  std::mutex mutex;
  std::condition_variable answered;
  std::uint64_t acks = 0, wrong = 0;
  auto name = trace::intern(source.to_string());
  auto actor = n.system().spawn([&, name]() -> caf::behavior {
    return {[&, name](const tensor_message& m) {
      tensor_receive_scope scope(name, m);
      std::lock_guard guard(mutex);
      ++acks;
      wrong += m.meta.micro_batch != 0;
      answered.notify_one();
    }};
  });
  job.must(n.register_actor(source, actor), "source");
  job.must(n.await_actor(sink, 30s), "source");
  auto value = tensor::full({count}, fill);
  std::uint64_t sent = 0; // written by this thread only, under the mutex
  const auto in_flight = static_cast<std::uint64_t>(window);
  // Sends until `limit` tensors or the deadline, then waits for every answer.
  auto stream = [&](std::uint64_t limit, steady_clock::time_point deadline) {
    std::unique_lock guard(mutex);
    while (sent < limit && steady_clock::now() < deadline) {
      if (!answered.wait_for(guard, 10s, [&] { return sent - acks < in_flight; }))
        job.fail(make_error(errc::io_error, "no acknowledgement of tensor {} within 10 s", acks), "source");
      const auto index = sent++; // before the send: its answer may come first
      guard.unlock();
      job.must(router->send(sink, numbered(value, index), {}, name), "source");
      guard.lock();
    }
    if (!answered.wait_for(guard, 10s, [&] { return acks == sent; }))
      job.fail(make_error(errc::io_error, "no acknowledgement of tensor {} within 10 s", acks), "source");
  };
  // Warm-up: the connection, the first rendezvous and the receiver's first
  // buffers, untimed.
  stream(2 * in_flight, steady_clock::now() + 60s);
  const auto warm = sent;
  const auto begin = steady_clock::now();
  stream(UINT64_MAX, begin + std::chrono::seconds(seconds));
  const double elapsed = duration<double>(steady_clock::now() - begin).count();
  const auto timed = sent - warm;
  const double mbits = static_cast<double>(timed) * static_cast<double>(count * 4) * 8 / elapsed / 1e6;
  if (json)
    fmt::print("{{\"bench\":\"job_stream\",\"bytes\":{},\"window\":{},\"tensors\":{},\"seconds\":{:.3f},"
               "\"mbits\":{:.1f},\"wrong\":{}}}\n",
               count * 4, window, timed, elapsed, mbits, wrong);
  else
    fmt::print("stream: {} tensors of {} bytes, {} in flight, {} -> {}: {:.1f} Mbit/s, #wrong {}\n", timed, count * 4,
               window, source.to_string(), sink.to_string(), mbits, wrong);
  return job.finish(wrong ? 1 : 0);
}
