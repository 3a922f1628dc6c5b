// Pipeline parallelism across processes: the character-level GPT of
// char_lm.cpp (4 transformer blocks, so 6 layers) split over one stage actor
// per process of the job. Every rank builds the same model from the same seed
// and registers the stage factory; rank 0 profiles the layers, chooses the
// balanced partition, and drives 1F1B with 4 micro-batches.
//
//   TROUPE_TRACE_DIR=/tmp/pd build/bin/troupe-launch -n 4 -- build/examples/pipeline_demo --steps=100
//   build/bin/troupe-trace summary /tmp/pd && build/bin/troupe-trace svg -o /tmp/pd.svg /tmp/pd
//
// prints (rank 0; times, samples/s and so the partition depend on the
// machine, losses do not; 4 processes sharing a 2-core machine):
//   [0] pipeline_demo: 237320 characters, vocabulary 86, 6 layers, 215168 parameters, 4 stages, 1F1B, 4 micro-batches
//   [0] stage 0: layers [0, 2), predicted 13.877 ms, 1.5 MiB
//   [0] stage 1: layers [2, 3), predicted 9.096 ms, 902.5 KiB
//   [0] stage 2: layers [3, 4), predicted 13.819 ms, 902.5 KiB
//   [0] stage 3: layers [4, 6), predicted 10.025 ms, 1.6 MiB
//   [0] step    1  loss 4.6239  samples/s 208.2
//   [0] step   10  loss 3.0960  samples/s 214.7
//   ...
//   [0] step  100  loss 2.4707  samples/s 228.7
//   [0] last step, per micro-batch:
//   [0] stage 0: layers [0, 2), predicted 13.877 ms, 1.5 MiB, measured 14.997 ms
//   [0] stage 1: layers [2, 3), predicted 9.096 ms, 902.5 KiB, measured 16.708 ms
//   [0] stage 2: layers [3, 4), predicted 13.819 ms, 902.5 KiB, measured 14.040 ms
//   [0] stage 3: layers [4, 6), predicted 10.025 ms, 1.6 MiB, measured 16.973 ms
// and the summary has a row per stage actor with its bubble fraction (1F1B
// theory for p = 4, m = 4: 3/7 = 43%):
//   actor                         node       handled       busy ms   busy %  bubble %
//   worker0/cpu/stage0            worker0        800      7697.765     53.6      44.2
//   worker1/cpu/stage1            worker1        800      7550.582     52.5      45.3
//   worker2/cpu/stage2            worker2        800      7887.855     54.9      42.8
//   worker3/cpu/stage3            worker3        800      9015.031     62.7      34.6
// Hybrid layout: --replicas=R runs R replicas of a pipeline of N/R stages,
// stage s of every replica averaging its gradients through its own reducer
// ring (2 stages x 2 replicas over 4 processes with -n 4 --replicas=2).
// Flags: --steps, --print-every, --micro-batches, --schedule=1f1b|gpipe,
// --replicas, --overlap-update=1 (pipeline_options::overlap_update: each
// step's last weight gradients and optimizer steps overlap the next step);
// any
// number of processes from 1 to 6 (one stage each).
#include <atomic>
#include <future>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "command_line.hpp"
#include "license_corpus.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/tensor_router.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/parallel/hybrid.hpp"

using namespace troupe;
using namespace std::chrono;

int main(int argc, char** argv) {
  examples::command_line cl(argc, argv);
  auto steps = cl.integer("steps", 100, 1, 1'000'000);
  auto every = cl.integer("print-every", 10, 1, 1'000'000);
  auto micro = cl.integer("micro-batches", 4, 1, 32);
  auto schedule = cl.text("schedule", "1f1b");
  auto replicas = cl.integer("replicas", 1, 1, 8);
  auto overlap = cl.integer("overlap-update", 0, 0, 1);
  auto options = actors::node_options::from(argc, argv);
  auto rest = cl.finish();
  for (const troupe::error* e : {steps ? nullptr : &steps.error(), every ? nullptr : &every.error(),
                                 micro ? nullptr : &micro.error(), replicas ? nullptr : &replicas.error(),
                                 overlap ? nullptr : &overlap.error(), options ? nullptr : &options.error(),
                                 rest ? nullptr : &rest.error()})
    if (e) return fmt::print(stderr, "pipeline_demo: {}\n", e->message()), 2;
  if (schedule != "1f1b" && schedule != "gpipe")
    return fmt::print(stderr, "pipeline_demo: --schedule is '{}' but must be 1f1b or gpipe\n", schedule), 2;
  if (options->world_size % *replicas != 0)
    return fmt::print(stderr, "pipeline_demo: --replicas={} does not divide the {} processes\n", *replicas,
                      options->world_size), 2;

  examples::license_corpus corpus;
  auto recipe = corpus.recipe(); // every rank: the same model from the same seed

  auto started = actors::node::start(*options);
  if (!started) return fmt::print(stderr, "pipeline_demo: {}\n", started.error().message()), 1;
  auto& n = **started;
  parallel::register_stage_factory(n, recipe);
  // Registered after the factory: once the driver finds it, this rank can
  // host a stage. Any message to it (or the driver's loss) ends this rank.
  const auto world = n.options().world_size;
  auto done_place = *actors::place::parse(n.name() + "/cpu/done");
  std::promise<void> done;
  std::atomic<bool> ended{false};
  auto end = [&] { if (!ended.exchange(true)) done.set_value(); };
  auto done_actor = n.system().spawn([&]() -> caf::behavior { return {[&](const actors::tensor_message&) { end(); }}; });
  (void)n.register_actor(done_place, done_actor);
  if (n.rank() != 0) {
    n.on_peer_lost([&](const auto&...) { end(); });
    bool ok = done.get_future().wait_for(600s) == std::future_status::ready;
    caf::anon_send_exit(done_actor, caf::exit_reason::user_shutdown);
    done_actor = nullptr;
    n.stop();
    return ok ? 0 : 1;
  }

  std::vector<std::string> places;
  for (std::uint32_t r = 0; r < world; ++r) {
    places.push_back(fmt::format("worker{}/cpu", r));
    auto peer_done = *actors::place::parse(places.back() + "/done");
    if (auto found = n.await_actor(peer_done, 30s); !found)
      return fmt::print(stderr, "pipeline_demo: {}\n", found.error().message()), 1;
  }
  // Replica k's stage s runs on worker<k * stages + s>; each replica
  // trains on its own `batch` rows of every step's batch.
  const auto stages = world / std::uint32_t(*replicas);
  constexpr std::int64_t batch = 32, seq = 64;
  const std::int64_t total = batch * *replicas;
  generator data_gen{2};
  auto next_batch = [&] { return corpus.batch(data_gen, total, seq); };

  auto pipe_options = parallel::remote_options(n, recipe);
  auto [x0, y0] = next_batch();
  parallel::balance_options balance;
  balance.stages = balance.activations_in_flight = stages; // 1F1B holds at most p micro-batches
  auto split = parallel::balance_by_time(*pipe_options.model, x0.narrow(0, 0, batch / *micro), balance);
  if (!split) return fmt::print(stderr, "pipeline_demo: {}\n", split.error().message()), 1;
  fmt::print("pipeline_demo: {} characters, vocabulary {}, {} layers, {} parameters, {} stages x {} replicas, {}, "
             "{} micro-batches\n", corpus.characters, corpus.vocab, pipe_options.model->size(),
             pipe_options.model->parameter_count(), stages, *replicas, schedule == "gpipe" ? "GPipe" : "1F1B", *micro);
  fmt::print("{}", parallel::to_string(*split));
  const auto kind = schedule == "gpipe" ? parallel::schedule_kind::gpipe : parallel::schedule_kind::one_f_one_b;
  std::unique_ptr<parallel::pipeline> pipe;
  std::unique_ptr<parallel::hybrid_pipeline> hybrid; // with --replicas > 1
  if (*replicas == 1) {
    pipe_options.places = places;
    pipe_options.split = *split;
    pipe_options.schedule = kind;
    pipe_options.micro_batches = std::size_t(*micro);
    pipe_options.overlap_update = *overlap == 1;
    auto created = parallel::pipeline::create(n.system(), std::move(pipe_options));
    if (!created) return fmt::print(stderr, "pipeline_demo: {}\n", created.error().message()), 1;
    pipe = std::move(*created);
  } else {
    parallel::hybrid_options h;
    h.recipe = recipe;
    h.split = *split;
    h.schedule = kind;
    h.micro_batches = std::size_t(*micro);
    h.overlap_update = *overlap == 1;
    for (std::uint32_t k = 0; k < std::uint32_t(*replicas); ++k)
      h.places.emplace_back(places.begin() + k * stages, places.begin() + (k + 1) * stages);
    auto created = parallel::hybrid_pipeline::create(n, std::move(h));
    if (!created) return fmt::print(stderr, "pipeline_demo: {}\n", created.error().message()), 1;
    hybrid = std::move(*created);
  }
  auto& first = hybrid ? hybrid->replica(0) : *pipe; // replica 0, for the stage statistics

  int status = 0;
  auto t0 = steady_clock::now();
  for (std::int64_t step = 1; step <= *steps; ++step) {
    auto [x, y] = step == 1 ? std::pair{x0, y0} : next_batch();
    auto loss = hybrid ? hybrid->train_step(x, y) : pipe->train_step(x, y);
    if (!loss) { fmt::print(stderr, "pipeline_demo: step {}: {}\n", step, loss.error().message()); status = 1; break; }
    if (step == 1 || step % *every == 0 || step == *steps) {
      double seconds = duration<double>(steady_clock::now() - t0).count();
      fmt::print("step {:4}  loss {:.4f}  samples/s {:.1f}\n", step, *loss, double(step * total) / seconds);
    }
  }
  if (auto stats = first.stats(); stats && status == 0) {
    std::vector<double> measured;
    for (const auto& s : *stats) measured.push_back(s.busy_ms / double(*micro)); // per micro-batch
    fmt::print("last step, per micro-batch:\n{}", parallel::to_string(*split, measured));
  }
  pipe.reset(); // stops the stages, then tells every other rank to end
  hybrid.reset();
  std::vector<std::promise<void>> sent(world);
  auto name = trace::intern("worker0/cpu/driver");
  for (std::uint32_t r = 1; r < world; ++r) {
    actors::tensor_message stop{{message_kind::control, 0, 0, 0, {}, 0, 0}, tensor::zeros({1}), 0};
    if (!n.router()->send(*actors::place::parse(places[r] + "/done"), std::move(stop),
                          [&sent, r](expected<void>) { sent[r].set_value(); }, name))
      sent[r].set_value();
    (void)sent[r].get_future().wait_for(10s);
  }
  caf::anon_send_exit(done_actor, caf::exit_reason::user_shutdown);
  done_actor = nullptr;
  std::fflush(stdout);
  n.stop();
  return status;
}
