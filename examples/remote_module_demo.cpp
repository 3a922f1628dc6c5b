// A module that lives in another process: rank 2 hosts the head,
// Linear(16, 4) with its own Adam, built by a factory; ranks 0 and 1 train a
// data-parallel body, Linear(8, 16) + ReLU, and call the head as if it were
// a local layer. Its backward sends the gradient to the host and returns the
// input's into the body's graph; one distributed optimizer steps the body
// here and the head where it lives.
//
//   build/bin/troupe-launch -n 3 -- build/examples/remote_module_demo --steps=40
//   [0] trainer 0 step    1  loss 1.43773
//   ...
//
// --one-process=1 (without the launcher) trains the same model on the same
// batches in one process, the mean of both trainers' losses per step, and
// prints the same lines (examples/check_remote_module_demo.sh compares them).
// --checkpoint-dir=DIR with --checkpoint-every=N (default 10): the host
// saves the head and its optimizer state from its own process, the trainers
// their body; a run resumes after the latest checkpoint in DIR.
#include <fmt/format.h>

#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/all.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/checkpoints.hpp"
#include "troupe/parallel/data_parallel.hpp"
#include "troupe/parallel/pipeline.hpp"
#include "troupe/parallel/remote_module.hpp"
#include "troupe/tensor/ops.hpp"

using namespace troupe;

namespace {

constexpr std::int64_t inputs = 8, hidden = 16, classes = 4, batch_size = 16;
constexpr double lr = 0.01;

std::shared_ptr<nn::sequential> make_body() {
  auto body = std::make_shared<nn::sequential>();
  body->append(nn::make<nn::linear>(inputs, hidden, 1));
  body->append(nn::make<nn::relu>());
  return body;
}

std::shared_ptr<nn::module> make_head() { return std::make_shared<nn::linear>(hidden, classes, 2); }

/// Trainer t's batch of step s, from its own seed: a resumed run draws the
/// batches it would have drawn.
std::pair<tensor, tensor> next_batch(std::uint32_t trainer, std::int64_t step) {
  generator gen{1000 + 2 * static_cast<std::uint64_t>(step) + trainer};
  auto x = randn({batch_size, inputs}, gen);
  return {x, randint({batch_size}, gen, 0, classes)};
}

void print_loss(std::uint32_t trainer, std::int64_t step, double loss) {
  fmt::print("trainer {} step {:4d}  loss {:.5f}\n", trainer, step, loss);
}

/// Both trainers' batches in one process: the loss is the mean of theirs,
/// as data parallelism and the head's average over its callers make it.
int one_process(std::int64_t steps) {
  auto body = make_body();
  auto head = make_head();
  optim::adam body_opt(body->named_parameters(), {.lr = lr});
  optim::adam head_opt(head->named_parameters(), {.lr = lr});
  for (std::int64_t step = 1; step <= steps; ++step) {
    body_opt.zero_grad();
    head_opt.zero_grad();
    autograd::variable losses[2];
    for (std::uint32_t i = 0; i < 2; ++i) {
      auto [x, targets] = next_batch(i, step);
      losses[i] = autograd::cross_entropy((*head)((*body)(autograd::variable(x))), targets);
    }
    autograd::backward((losses[0] + losses[1]) * 0.5);
    body_opt.step();
    head_opt.step();
    for (std::uint32_t i = 0; i < 2; ++i)
      print_loss(i, step, losses[i].item());
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto steps = job.flag("steps", 40, 1, 1'000'000);
  const auto one = job.flag("one-process", 0, 0, 1);
  const auto directory = job.flag("checkpoint-dir", ""); // none: no checkpoints
  const auto every = job.flag("checkpoint-every", 10, 1, 1'000'000);
  job.start();
  if (one == 1) {
    if (job.world_size() != 1)
      job.fail(make_error(errc::invalid_argument, "--one-process=1 runs without the launcher (world size 1, not {})",
                          job.world_size()));
    return job.finish(one_process(steps));
  }
  if (job.world_size() != 3)
    job.fail(make_error(errc::invalid_argument, "needs 3 ranks (2 trainers, the head's host), not {}",
                        job.world_size()));

  parallel::remote_module_options m{.name = "head", .place = job.places()[2],
                                    .callers = {job.places()[0], job.places()[1]}, .factory = make_head,
                                    .optimizer = parallel::adam_factory({.lr = lr})};
  if (job.rank() == 2) {
    auto host = job.must(parallel::remote_module_host::host(job, m), "remote module host");
    return job.serve();
  }
  const auto trainer = job.rank();
  auto head = job.must(parallel::remote_module::connect(job, m), "remote module");
  auto group = job.must(parallel::reducer_group::join(
    job, {.rank = trainer, .places = parallel::reducer_places({job.nodes()[0], job.nodes()[1]})}));
  auto body = make_body();
  auto dp = job.must(parallel::data_parallel::create(body->named_parameters(), group));
  parallel::distributed_optimizer optimizer(
    std::make_unique<optim::adam>(body->named_parameters(), optim::adam_options{.lr = lr}), {&head});
  // Trainer 0 (rank 0) coordinates; the host writes the head from its own
  // process.
  auto ckpt = job.must(parallel::checkpoints::create(job, {.directory = directory, .every = every}));
  ckpt.track(*body, *optimizer.local(), dp);
  ckpt.track(head);
  const auto done = job.must(ckpt.resume(), "resume");
  for (std::int64_t step = done + 1; step <= steps; ++step) {
    auto [x, targets] = next_batch(trainer, step);
    optimizer.zero_grad();
    autograd::variable loss;
    try { // a call that fails (a lost host) throws from the forward pass
      loss = autograd::cross_entropy(head((*body)(autograd::variable(x))), targets);
    } catch (const std::exception& e) {
      job.fail(make_error(errc::io_error, "{}", e.what()), fmt::format("step {}", step));
    }
    job.must(dp.backward(loss), fmt::format("step {}", step));
    job.must(optimizer.step(), fmt::format("step {}", step));
    print_loss(trainer, step, loss.item());
    job.must(ckpt.save_if_due(step), fmt::format("checkpoint at step {}", step));
  }
  job.must(ckpt.wait(), "the last checkpoint");
  return job.finish(0);
}
