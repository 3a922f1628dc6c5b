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
//   [0] step    1  loss 4.6214  samples/s ...  reduction hidden behind backward ...%
//   ...
//   [0] step   60  loss 2.6...
//   [0] replicas identical: yes
// The trace summary has a row per replica with its "backward" and
// "allreduce" spans; the SVG shows the buckets' allreduce under backward.
// Flags: --steps, --print-every, --batch (per replica), --bucket-kib.
#include <fmt/format.h>

#include "command_line.hpp"
#include "license_corpus.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/parallel/collectives.hpp"
#include "troupe/parallel/data_parallel.hpp"

using namespace troupe;
using namespace std::chrono;

int main(int argc, char** argv) {
  examples::command_line cl(argc, argv);
  auto steps = cl.integer("steps", 60, 1, 1'000'000);
  auto every = cl.integer("print-every", 10, 1, 1'000'000);
  auto batch = cl.integer("batch", 16, 1, 4096);
  auto bucket_kib = cl.integer("bucket-kib", 256, 1, 1 << 20);
  auto options = actors::node_options::from(argc, argv);
  auto rest = cl.finish();
  for (const troupe::error* e : {steps ? nullptr : &steps.error(), every ? nullptr : &every.error(),
                                 batch ? nullptr : &batch.error(), bucket_kib ? nullptr : &bucket_kib.error(),
                                 options ? nullptr : &options.error(), rest ? nullptr : &rest.error()})
    if (e) return fmt::print(stderr, "data_parallel_demo: {}\n", e->message()), 2;

  examples::license_corpus corpus;
  auto recipe = corpus.recipe();
  auto started = actors::node::start(*options);
  if (!started) return fmt::print(stderr, "data_parallel_demo: {}\n", started.error().message()), 1;
  auto& node = **started;
  const auto world = node.options().world_size;
  int status = 0;
  {
    std::vector<std::string> names;
    for (std::uint32_t r = 0; r < world; ++r) names.push_back(fmt::format("worker{}", r));
    auto group = parallel::reducer_group::join(node, {.rank = node.rank(), .places = parallel::reducer_places(names)});
    if (!group) return fmt::print(stderr, "data_parallel_demo: {}\n", group.error().message()), 1;
    auto model = recipe.model();
    parallel::data_parallel_options dp_options;
    dp_options.buckets.bucket_bytes = std::size_t(*bucket_kib) << 10;
    auto dp = parallel::data_parallel::create(model->named_parameters(), **group, dp_options);
    if (!dp) return fmt::print(stderr, "data_parallel_demo: {}\n", dp.error().message()), 1;
    auto optimizer = recipe.optimizer(model->named_parameters());
    if (node.rank() == 0)
      fmt::print("data_parallel_demo: {} replicas, {} parameters in {} buckets, batch {} per replica\n", world,
                 model->parameter_count(), (*dp)->buckets().size(), *batch);
    generator data{100 + node.rank()}; // every replica its own batches
    auto t0 = steady_clock::now();
    for (std::int64_t step = 1; step <= *steps && status == 0; ++step) {
      auto [x, y] = corpus.batch(data, *batch, 64);
      optimizer->zero_grad();
      auto loss = recipe.loss((*model)(autograd::variable(x)), y);
      if (auto ok = (*dp)->backward(loss); !ok) {
        fmt::print(stderr, "data_parallel_demo: step {}: {}\n", step, ok.error().message());
        status = 1;
        break;
      }
      optimizer->step();
      if (node.rank() == 0 && (step == 1 || step % *every == 0 || step == *steps))
        fmt::print("step {:4}  loss {:.4f}  samples/s {:.1f}  reduction hidden behind backward {:.0f}%\n", step,
                   loss.item(), double(step * *batch * world) / duration<double>(steady_clock::now() - t0).count(),
                   100 * (*dp)->last_stats().hidden_fraction());
    }
    // Are the replicas identical? Each compares its per-parameter sums
    // with rank 0's, bitwise; the ring adds up the yes votes.
    if (status == 0) {
      auto params = model->parameters();
      auto mine = tensor::zeros({std::int64_t(params.size())}, dtype::float64);
      for (std::size_t i = 0; i < params.size(); ++i) mine.data<double>()[i] = sum(params[i].data()).item();
      auto root = mine.clone();
      auto votes = tensor::zeros({1}, dtype::float64);
      if (parallel::broadcast(**group, root, {.root = 0})) {
        votes.fill(mine.to_vector<double>() == root.to_vector<double>() ? 1.0 : 0.0);
        (void)parallel::ring_allreduce(**group, votes);
      }
      if (node.rank() == 0) fmt::print("replicas identical: {}\n", votes.item() == world ? "yes" : "no");
      std::fflush(stdout);
    }
    dp->reset();
  }
  node.stop();
  return status;
}
