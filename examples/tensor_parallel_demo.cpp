// Tensor x pipeline (x data) parallelism across processes: the character-level
// GPT of pipeline_demo.cpp with every layer split over --tensor ranks
// (attention heads, MLP width and vocabulary divided, Megatron-LM's layout),
// its 6 layers cut into stages, and the whole replicated --replicas times.
// Every process is one rank of the mesh {data, pipeline, tensor}, so the
// stages number processes / (tensor x replicas); rank 0 drives.
//
//   build/bin/troupe-launch -n 4 -- build/examples/tensor_parallel_demo --tensor=2 --steps=50
//
// prints (rank 0; every layout trains on the same batches of 16 windows, so
// the losses are one process's, `--tensor=1` on `-n 1`, within float
// rounding):
//   [0] tensor_parallel_demo: 6 layers, 2 stages x 2 tensor ranks x 1 replicas, 2 micro-batches
//   [0] step    1  loss 4.6239  samples/s 41.5
//   ...
// Flags: --steps, --print-every, --tensor (1-8), --replicas (1-8),
// --micro-batches, --sequence-parallel=1 (layer norms and dropout on a
// piece of the sequence each: reduce-scatter and all-gather instead of the
// allreduces). --checkpoint-dir=DIR with --checkpoint-every=N (default 20):
// every stage saves its pieces with their global shapes every N steps, and
// a run resumes after the latest checkpoint in DIR, at whatever layout.
// --device=cuda:0 puts every rank's pieces on its machine's first GPU.
#include <fmt/format.h>

#include "license_corpus.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/checkpoints.hpp"
#include "troupe/parallel/tensor_parallel_pipeline.hpp"
#include "troupe/parallel/tensor_parallel_transformer.hpp"
#include "troupe/parallel/vocab_parallel.hpp"

using namespace troupe;

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto steps = job.flag("steps", 50, 1, 1'000'000);
  const auto tensor_ranks = job.flag("tensor", 2, 1, 8);
  const auto replicas = job.flag("replicas", 1, 1, 8);
  const auto micro = job.flag("micro-batches", 2, 1, 16);
  const auto sequence_parallel = job.flag("sequence-parallel", 0, 0, 1);
  const auto directory = job.flag("checkpoint-dir", ""); // none: no checkpoints
  const auto every = job.flag("checkpoint-every", 20, 1, 1'000'000);
  const auto where = job.flag("device", device::cpu()); // every rank's pieces
  examples::license_corpus corpus;
  job.start();
  constexpr std::int64_t batch = 16, seq = 64; // the whole batch, shared by the replicas
  const auto per_stage = std::uint32_t(tensor_ranks * replicas);
  if (job.world_size() % per_stage != 0 || job.world_size() / per_stage > 6 || batch % replicas != 0 ||
      micro > batch / replicas) {
    if (job.is_driver())
      fmt::print(stderr, "tensor_parallel_demo: {} processes for --tensor={} x --replicas={}, --micro-batches={}: "
                         "need a multiple, at most 6 stages, replicas dividing the batch of {} and a sample for "
                         "every micro-batch\n", job.world_size(), tensor_ranks, replicas, micro, batch);
    return job.finish(2);
  }

  const auto config = corpus.gpt();
  const auto vocab = corpus.vocab;
  auto tp = job.must(parallel::tensor_parallel_pipeline::create(
    job, {.tensor = std::uint32_t(tensor_ranks), .data = std::uint32_t(replicas),
          .model = [&](parallel::reducer_group& group) {
            return std::make_shared<parallel::parallel_gpt>(config, group,
                                                            parallel::tensor_parallel_options{sequence_parallel == 1});
          },
          .loss = [vocab](parallel::reducer_group& group) -> parallel::loss_function {
            return [&group, vocab](const autograd::variable& logits, const tensor& targets) {
              return parallel::vocab_parallel_cross_entropy(autograd::reshape(logits, {targets.numel(), -1}),
                                                            targets.reshape({-1}), group, vocab);
            };
          },
          .pipeline = {.places = job.places(where.to_string()), .micro_batches = std::size_t(micro),
                       .optimizer = corpus.recipe().optimizer}}));
  if (!job.is_driver()) return job.serve();

  fmt::print("tensor_parallel_demo: {} layers, {} stages x {} tensor ranks x {} replicas, {} micro-batches{}\n",
             config.n_layer + 2, job.world_size() / per_stage, tensor_ranks, replicas, micro,
             sequence_parallel == 1 ? ", sequence parallel" : "");
  generator data{2};
  auto ckpt = job.must(parallel::checkpoints::create(job, {.directory = directory, .every = every}));
  ckpt.track(tp);
  ckpt.track("data", data); // the data order goes on where it stopped
  const auto done = job.must(ckpt.resume(), "resume");

  for (auto step : job.steps(steps, done)) {
    auto [x, y] = corpus.batch(data, batch, seq);
    step.report(job.must(tp.train_step(x, y), fmt::format("step {}", step.number())), batch);
    job.must(ckpt.save_if_due(step), fmt::format("checkpoint at step {}", step.number()));
  }
  job.must(ckpt.wait(), "the last checkpoint");
  return job.finish(0);
}
