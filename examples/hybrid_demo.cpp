// Hybrid parallelism: R replicas of a pipeline, each of N/R stages over the
// job's N processes (replica k's stage s on rank k * N/R + s). Every
// replica trains on its own rows of each step's batch; stage s of every
// replica averages its gradients with the others through its own reducer
// ring, so the replicas take the same steps as one pipeline on the whole
// batch. The model and partition are pipeline_demo.cpp's.
//
//   TROUPE_TRACE_DIR=/tmp/hd build/bin/troupe-launch -n 4 -- build/examples/hybrid_demo --replicas=2
//   build/bin/troupe-trace summary /tmp/hd
//
// Flags: --steps, --print-every, --micro-batches, --schedule=1f1b|gpipe,
// --replicas (at least 2, dividing the processes), --overlap-update=1,
// --device=cuda:0 (every stage on its rank's machine's first GPU).
#include <fmt/format.h>

#include "license_corpus.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/hybrid.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto steps = job.flag("steps", 100, 1, 1'000'000);
  const auto micro = job.flag("micro-batches", 4, 1, 32);
  const auto schedule = job.flag("schedule", "1f1b", {"1f1b", "gpipe"});
  const auto replicas = job.flag("replicas", 2, 2, 8);
  const auto overlap = job.flag("overlap-update", 0, 0, 1);
  const auto where = job.flag("device", device::cpu()); // every stage's
  examples::license_corpus corpus;
  job.host_stages(corpus.recipe());
  job.start();
  if (!job.is_driver()) return job.serve();
  if (job.world_size() % replicas != 0)
    return fmt::print(stderr, "hybrid_demo: --replicas={} does not divide the {} processes\n", replicas,
                      job.world_size()), job.finish(2);

  constexpr std::int64_t batch = 32, seq = 64; // per replica
  const auto stages = job.world_size() / std::uint32_t(replicas);
  generator data{2};
  auto [x0, y0] = corpus.batch(data, batch * replicas, seq);
  auto model = job.stages().model();
  auto split = job.must(parallel::balance_by_time(*model, x0.narrow(0, 0, batch / micro),
                                         {.stages = stages, .activations_in_flight = stages}));
  fmt::print("hybrid_demo: {} layers, {} parameters, {} stages x {} replicas, {}, {} micro-batches\n",
             model->size(), model->parameter_count(), stages, replicas, schedule == "gpipe" ? "GPipe" : "1F1B", micro);
  fmt::print("{}", parallel::to_string(split));
  auto hybrid = job.must(parallel::hybrid_pipeline::create(
    job, {.replicas = std::size_t(replicas), .where = where,
          .pipeline = {.split = split, .schedule = parallel::schedule_named(schedule),
                       .micro_batches = std::size_t(micro), .overlap_update = overlap == 1}}));

  for (auto step : job.steps(steps)) {
    auto [x, y] = step == 1 ? std::pair{x0, y0} : corpus.batch(data, batch * replicas, seq);
    step.report(job.must(hybrid.train_step(x, y), fmt::format("step {}", step.number())), batch * replicas);
  }
  return job.finish(0);
}
