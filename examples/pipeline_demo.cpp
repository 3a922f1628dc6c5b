// Pipeline parallelism across processes: the character-level GPT of
// char_lm.cpp (4 transformer blocks, so 6 layers) split over one stage actor
// per process of the job. Every rank hosts stages built from the same recipe
// (the same model from the same seed); rank 0 profiles the layers, chooses
// the balanced partition, and drives 1F1B with 4 micro-batches.
//
//   TROUPE_TRACE_DIR=/tmp/pd build/bin/troupe-launch -n 4 -- build/examples/pipeline_demo --steps=100
//   build/bin/troupe-trace summary /tmp/pd && build/bin/troupe-trace svg -o /tmp/pd.svg /tmp/pd
//
// prints (rank 0; times, samples/s and so the partition depend on the
// machine, losses do not; 4 processes sharing a 2-core machine):
//   [0] pipeline_demo: 6 layers, 215168 parameters, 4 stages, 1f1b, 4 micro-batches
//   [0] stage 0: layers [0, 2), predicted 13.877 ms, 1.5 MiB
//   ...
//   [0] step    1  loss 4.6239  samples/s 208.2
//   [0] step  100  loss 2.4707  samples/s 228.7
//   [0] last step, per micro-batch:
//   [0] stage 0: layers [0, 2), predicted 13.877 ms, 1.5 MiB, measured 14.997 ms
//   ...
// and the trace summary has a row per stage actor with its bubble fraction
// (1F1B theory for p = 4, m = 4: 3/7 = 43%). Flags: --steps, --print-every,
// --micro-batches, --schedule=1f1b|gpipe, --overlap-update=1 (each step's
// last weight gradients and optimizer steps overlap the next step). Any
// number of processes from 1 to 6 (one stage each); hybrid_demo.cpp adds
// replicas. --checkpoint-dir=DIR with --checkpoint-every=N (default 20):
// every stage saves its layers and optimizer every N steps, and a run
// resumes after the latest checkpoint in DIR (whatever the partition then).
// --device=cuda:0 puts every rank's stage on its machine's first GPU.
#include <fmt/format.h>

#include "license_corpus.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/checkpoints.hpp"
#include "troupe/parallel/remote.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto steps = job.flag("steps", 100, 1, 1'000'000);
  const auto micro = job.flag("micro-batches", 4, 1, 32);
  const auto schedule = job.flag("schedule", "1f1b", {"1f1b", "gpipe"});
  const auto overlap = job.flag("overlap-update", 0, 0, 1);
  const auto directory = job.flag("checkpoint-dir", ""); // none: no checkpoints
  const auto every = job.flag("checkpoint-every", 20, 1, 1'000'000);
  const auto where = job.flag("device", device::cpu()); // every stage's
  examples::license_corpus corpus;
  job.host_stages(corpus.recipe()); // every rank: the same model from the same seed
  job.start();
  if (!job.is_driver()) return job.serve();

  constexpr std::int64_t batch = 32, seq = 64;
  generator data{2};
  auto model = job.stages().model();
  const std::size_t p = job.world_size(); // 1F1B holds at most p micro-batches per stage
  auto split = job.must(parallel::balance_by_time(*model, corpus.batch(data, batch / micro, seq).first,
                                                  {.stages = p, .activations_in_flight = p}));
  fmt::print("pipeline_demo: {} layers, {} parameters, {} stages, {}, {} micro-batches\n{}", model->size(),
             model->parameter_count(), p, schedule, micro, parallel::to_string(split));
  auto pipe = job.must(parallel::pipeline::create(
    job, {.model = model, .places = job.places(where.to_string()), .split = split,
          .schedule = parallel::schedule_named(schedule), .micro_batches = std::size_t(micro),
          .overlap_update = overlap == 1}));

  auto ckpt = job.must(parallel::checkpoints::create(job, {.directory = directory, .every = every}));
  ckpt.track(pipe);
  ckpt.track("data", data); // the data order goes on where it stopped
  const auto done = job.must(ckpt.resume(), "resume");

  for (auto step : job.steps(steps, done)) {
    auto [x, y] = corpus.batch(data, batch, seq);
    step.report(job.must(pipe.train_step(x, y), fmt::format("step {}", step.number())), batch);
    job.must(ckpt.save_if_due(step), fmt::format("checkpoint at step {}", step.number()));
  }
  job.must(ckpt.wait(), "the last checkpoint");
  const auto measured = parallel::per_micro_batch_ms(job.must(pipe.stats()), std::size_t(micro));
  fmt::print("last step, per micro-batch:\n{}", parallel::to_string(split, measured));
  return job.finish(0);
}
