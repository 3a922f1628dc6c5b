// Data parallelism across processes: every rank holds the char-level GPT of
// pipeline_demo.cpp and trains on its own batches; after each backward the
// replicas' gradients are averaged through the ring of reducer actors —
// bucket by bucket, while backward is still running — so every rank takes
// the same optimizer step and the replicas stay bitwise identical.
//
//   TROUPE_TRACE_DIR=/tmp/dp build/bin/troupe-launch -n 2 -- build/examples/data_parallel_demo --steps=60
//   build/bin/troupe-trace summary /tmp/dp && build/bin/troupe-trace svg -o /tmp/dp.svg /tmp/dp
//
// prints (rank 0; losses do not depend on the machine, times do):
//   [0] data_parallel_demo: 2 replicas, 215168 parameters in 3 buckets, batch 16 per replica
//   [0] step    1  loss 4.6403  samples/s ...  reduction hidden behind backward ...%
//   ...
//   [0] replicas identical: yes
// The trace summary has a row per replica with its "backward" and
// "allreduce" spans; the SVG shows the buckets' allreduce under backward.
// Flags: --steps, --print-every, --batch (per replica), --bucket-kib,
// --device=cuda:0 (every replica on its machine's first GPU; replicas
// sharing one reduce through the host, on GPUs of their own with NCCL),
// --checkpoint-dir=DIR with --checkpoint-every=N (default 20): save every N
// steps (asynchronously) and, when DIR holds a checkpoint, resume after it.
// Under `troupe-launch --restarts=1`, a rank killed mid-run restarts the
// job, which resumes from the latest checkpoint with the losses of an
// uninterrupted run: each rank's batches are a function of its rank and the
// step, not of how many batches it drew before.
#include <chrono>
#include <fmt/format.h>

#include "license_corpus.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/checkpoints.hpp"
#include "troupe/parallel/data_parallel.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto steps = job.flag("steps", 60, 1, 1'000'000);
  const auto batch = job.flag("batch", 16, 1, 4096);
  const auto bucket_bytes = std::size_t(job.flag("bucket-kib", 256, 1, 1 << 20)) << 10;
  const auto directory = job.flag("checkpoint-dir", ""); // none: no checkpoints
  const auto every = job.flag("checkpoint-every", 20, 1, 1'000'000);
  const auto where = job.flag("device", device::cpu());
  job.start();
  examples::license_corpus corpus;
  auto recipe = corpus.recipe();
  auto model = recipe.model(); // every rank: the same model from the same seed
  model->to(where);
  auto dp = job.must(parallel::data_parallel::create(job, model->named_parameters(), {.buckets = {bucket_bytes}}));
  auto optimizer = recipe.optimizer(model->named_parameters());
  auto ckpt = job.must(parallel::checkpoints::create(job, {.directory = directory, .every = every}));
  ckpt.track(*model, *optimizer, dp);
  const auto done = job.must(ckpt.resume(), "resume");
  for (auto step : job.steps(steps, done)) {
    auto data = generator{100 + job.rank()}.fork(std::uint64_t(step)); // every replica its own batches
    auto [x, y] = corpus.batch(data, batch, 64);
    optimizer->zero_grad();
    auto loss = recipe.loss((*model)(autograd::variable(x.to(where))), y.to(where));
    job.must(dp.backward(loss), fmt::format("step {}", step.number()));
    optimizer->step();
    step.report(loss.item(), batch * job.world_size(), "  " + dp.last_stats().summary());
    job.must(ckpt.save_if_due(step), fmt::format("checkpoint at step {}", step.number()));
  }
  job.must(ckpt.wait(), "the last checkpoint");
  // A collective on every rank: each compares its parameters with rank 0's, bit for bit.
  if (const bool same = job.must(dp.replicas_identical()); job.is_driver())
    fmt::print("replicas identical: {}\n", same ? "yes" : "no");
  return job.finish(0);
}
