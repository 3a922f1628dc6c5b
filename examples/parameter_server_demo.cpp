// The "Combining Distributed DataParallel with Distributed RPC" topology:
// a master (rank 0), a parameter server holding EmbeddingBag(100, 16, sum)
// (rank 1), and two trainers (ranks 2, 3) whose Linear(16, 8) is data
// parallel; one distributed optimizer steps the remote table and the local
// layer together.
//
//   build/bin/troupe-launch -n 4 -- build/examples/parameter_server_demo --epochs=20
//   [2] trainer 0 step    1  loss 2.4561
//   ...
//
// --one-process=1 (without the launcher) trains the same model on the same
// batches in one process, the average of both trainers' losses per step,
// and prints the same lines: in synchronous mode they agree to float
// rounding (examples/check_parameter_server_demo.sh compares them).
// --checkpoint-dir=DIR with --checkpoint-every=N (default 50): the server
// saves its table and its optimizer state, the trainers their layer, every
// N steps; a run resumes after the latest checkpoint in DIR.
#include <chrono>

#include <fmt/format.h>

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/checkpoints.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/parallel/parameter_server.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;

namespace {

constexpr std::int64_t rows = 100, dim = 16, classes = 8;
constexpr std::uint64_t table_seed = 0, dense_seed = 1;

/// The tutorial's random batches: 20..50 ids, bags of 1..10, 8 classes;
/// trainer t's batch of step s comes from its own seed, so a resumed run
/// draws the batches it would have drawn.
struct batch {
  tensor ids, offsets, targets;
};
batch next_batch(std::uint32_t trainer, std::int64_t step) {
  generator gen{1000 + 2 * static_cast<std::uint64_t>(step) + trainer};
  auto draw = [&](std::int64_t low, std::int64_t high) { return randint({1}, gen, low, high).to_vector<std::int64_t>()[0]; };
  auto n = draw(20, 51);
  auto ids = randint({n}, gen, 0, rows);
  std::vector<std::int64_t> offsets;
  for (std::int64_t start = 0; start < n; start += draw(1, 11))
    offsets.push_back(start);
  auto bags = static_cast<std::int64_t>(offsets.size());
  return {ids, tensor::from(offsets, {bags}), randint({bags}, gen, 0, classes)};
}

void print_loss(std::uint32_t trainer, std::int64_t step, double loss) {
  fmt::print("trainer {} step {:4d}  loss {:.5f}\n", trainer, step, loss);
}

/// Both trainers' batches in one process: the loss is the mean of theirs,
/// as data parallelism averages the gradients.
int one_process(std::int64_t steps) {
  generator init{table_seed};
  auto table = autograd::variable(randn({rows, dim}, init), true);
  nn::linear fc(dim, classes, dense_seed);
  optim::sgd table_opt({{"table", table}}, {.lr = 0.05});
  optim::sgd fc_opt(fc.named_parameters(), {.lr = 0.05});
  for (std::int64_t step = 1; step <= steps; ++step) {
    table_opt.zero_grad();
    fc_opt.zero_grad();
    autograd::variable losses[2];
    for (std::uint32_t i = 0; i < 2; ++i) {
      auto b = next_batch(i, step);
      losses[i] = autograd::cross_entropy(fc(autograd::embedding_bag(table, b.ids, b.offsets, bag_mode::sum)), b.targets);
    }
    autograd::backward((losses[0] + losses[1]) * 0.5);
    table_opt.step();
    fc_opt.step();
    for (std::uint32_t i = 0; i < 2; ++i)
      print_loss(i, step, losses[i].item());
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto epochs = job.flag("epochs", 20, 1, 100'000); // 10 batches each, as in the tutorial
  const auto one = job.flag("one-process", 0, 0, 1);
  const auto mode = job.flag("consistency", "synchronous", {"synchronous", "asynchronous", "bounded"});
  const auto staleness = job.flag("staleness", 2, 0, 1000);
  // For bench/parameter_server: untimed steps first, then one line with the
  // timed steps' rate (as the PyTorch peer times its loop after a warm-up).
  const auto warmup = job.flag("warmup", 0, 0, 100'000);
  const auto print_losses = job.flag("print-losses", 1, 0, 1);
  const auto directory = job.flag("checkpoint-dir", ""); // none: no checkpoints
  const auto every = job.flag("checkpoint-every", 50, 1, 1'000'000);
  const auto steps = epochs * 10;
  job.start();
  if (one == 1) {
    if (job.world_size() != 1)
      job.fail(make_error(errc::invalid_argument, "--one-process=1 runs without the launcher (world size 1, not {})",
                          job.world_size()));
    return job.finish(one_process(steps));
  }
  if (job.world_size() != 4)
    job.fail(make_error(errc::invalid_argument, "needs 4 ranks (master, server, 2 trainers), not {}", job.world_size()));

  parallel::parameter_server_options ps;
  ps.tables = {{.name = "emb", .rows = rows, .dim = dim, .seed = table_seed, .optimizer = {.lr = 0.05},
                .consistency = mode == "synchronous"    ? parallel::consistency::synchronous()
                               : mode == "asynchronous" ? parallel::consistency::asynchronous()
                                                        : parallel::consistency::bounded(staleness)}};
  ps.servers = {job.places()[1]};
  ps.trainers = {job.places()[2], job.places()[3]};

  if (job.rank() == 0) { // the master: the job's driver, waits for everyone
    fmt::print("master: table emb {}x{} on {}, trainers {} and {}, {}\n", rows, dim, ps.servers[0], ps.trainers[0],
               ps.trainers[1], mode);
    return job.finish(0);
  }
  if (job.rank() == 1) {
    auto server = job.must(parallel::parameter_server::host(job, ps), "parameter server");
    return job.serve();
  }
  const auto trainer = job.rank() - 2;
  auto client = job.must(parallel::parameter_client::connect(job, ps), "parameter client");
  auto group = job.must(parallel::reducer_group::join(
      job, {.rank = trainer, .places = parallel::reducer_places({job.nodes()[2], job.nodes()[3]})}));
  auto fc = std::make_shared<nn::linear>(dim, classes, dense_seed);
  auto dp = job.must(parallel::data_parallel::create(fc->named_parameters(), group));
  parallel::remote_embedding_bag emb(client, "emb", bag_mode::sum);
  parallel::distributed_optimizer optimizer(std::make_unique<optim::sgd>(fc->named_parameters(), optim::sgd_options{.lr = 0.05}),
                                            {&client});
  // Trainer 0 (rank 2) coordinates: it writes the manifest and commits; the
  // server writes its table and optimizer state from its own process.
  auto ckpt = job.must(parallel::checkpoints::create(job, {.directory = directory, .every = every, .coordinator = 2}));
  ckpt.track(*fc, *optimizer.local(), dp);
  ckpt.track(client);
  const auto done = job.must(ckpt.resume(), "resume");
  auto timed_from = std::chrono::steady_clock::now();
  for (std::int64_t step = done + 1; step <= warmup + steps; ++step) {
    if (step == std::max(done, warmup) + 1)
      timed_from = std::chrono::steady_clock::now();
    auto b = next_batch(trainer, step);
    optimizer.zero_grad();
    autograd::variable loss;
    try { // a lookup that fails (a lost server) throws from the forward pass
      loss = autograd::cross_entropy((*fc)(emb(b.ids, b.offsets)), b.targets);
    } catch (const std::exception& e) {
      job.fail(make_error(errc::io_error, "{}", e.what()), fmt::format("step {}", step));
    }
    job.must(dp.backward(loss), fmt::format("step {}", step));
    job.must(optimizer.step(), fmt::format("step {}", step));
    if (print_losses == 1)
      print_loss(trainer, step, loss.item());
    job.must(ckpt.save_if_due(step), fmt::format("checkpoint at step {}", step));
  }
  job.must(ckpt.wait(), "the last checkpoint");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - timed_from).count();
  const auto timed = warmup + steps - std::max(done, warmup);
  fmt::print("trainer {}: timed {} iterations in {:.4f} s ({:.1f} it/s)\n", trainer, timed, seconds,
             static_cast<double>(timed) / seconds);
  return job.finish(0);
}
