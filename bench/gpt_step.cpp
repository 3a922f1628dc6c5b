// GPT training steps, troupe beside PyTorch (bench/peers/gpt_step_torch.py:
// the same architecture, sizes, AdamW(weight decay 0.01, the size's lr), exact
// GELU and float32; on CUDA with TF32 off on both sides, on the CPU with one
// thread each) in interleaved rounds of the same run.
//
//   build/bench/gpt_step [--json] [--device=cpu|cuda:0] [--models=char_lm,gpt] [--rounds=3]
//                        [--steps=3] [--drift-steps=2000] [--threads=1] [--python=/usr/bin/python3]
//                        [--peer=bench/peers/gpt_step_torch.py] [--no-peers]
//
// Models: char_lm (examples/char_lm.cpp: vocabulary 86, width 64, 4 heads,
// 2 blocks, sequence 64, batch 16), gpt (6 blocks, width 256, 8 heads,
// sequence 128, batch 16) and gpt_wide (the same, ten times wider: width
// 2560; meant for a GPU). With --device=cuda:0 and no device it says so and
// exits 0 (nothing to measure).
//
// --threads=N gives both sides N intra-op threads (troupe's
// set_intra_op_threads, PyTorch's set_num_threads); the default is one, the
// setting of every distributed figure.
//
// --drift-steps=N (char_lm only, N >= 200) then trains char_lm on to step N
// and compares troupe's step time there with its time around step 100: as
// training proceeds the activations grow, and a kernel whose cost depends
// on its inputs' magnitude (glibc's erff did) slows the step. The two are
// timed alternately in the same minute (a second copy of the model trained
// to step 90, then 20 steps of each in turn), because a VM's own speed can
// move for minutes at a time (docs/performance.md, "the drift measure").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "models.hpp"
#include "training_step_options.hpp"
#include "training_step_rounds.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/gpt.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/tensor/cuda.hpp"
#include "troupe/tensor/intra_op_threads.hpp"

using namespace troupe;

namespace {

using bench::gpt_size;
constexpr const auto& sizes = bench::gpt_sizes;
constexpr std::int64_t vocabulary = bench::gpt_vocabulary;

/// A GPT and its AdamW, trained one step at a time on a fixed batch.
struct trainer {
  nn::gpt model;
  std::unique_ptr<optim::adamw> opt;
  trainer(const gpt_size& size, device where) : model(bench::gpt_config_of(size)), size_(size) {
    model.to(where); // before the optimizer takes the parameters
    opt = std::make_unique<optim::adamw>(
      model.named_parameters(), optim::adam_options{.lr = size.lr, .weight_decay = bench::gpt_weight_decay});
  }
  /// One step; its loss (on a GPU, waiting for the step's kernels).
  double step(const tensor& ids, const tensor& targets) {
    opt->zero_grad();
    auto logits = model(autograd::variable(ids));
    auto loss =
      autograd::cross_entropy(autograd::reshape(logits, {size_.batch * size_.sequence, vocabulary}), targets);
    autograd::backward(loss);
    opt->step();
    return loss.item();
  }

private:
  gpt_size size_;
};

} // namespace

int main(int argc, char** argv) {
  bench::check_flags("gpt_step", argc, argv, {"device=", "models=", "rounds=", "steps=", "drift-steps=", "threads=", "python=", "peer=", "no-peers"});
  bench::report out("gpt_step", argc, argv);
  const auto rounds = static_cast<int>(bench::int_option(argc, argv, "rounds", 3, 1, 100));
  const auto steps = static_cast<int>(bench::int_option(argc, argv, "steps", 3, 1, 1000));
  const auto drift_steps = static_cast<int>(bench::int_option(argc, argv, "drift-steps", 0, 0, 100000));
  const auto threads = static_cast<int>(bench::int_option(argc, argv, "threads", 1, 1, 256));
  set_intra_op_threads(threads);
  if (drift_steps != 0 && drift_steps < 200) {
    std::fprintf(stderr, "gpt_step: --drift-steps: '%d' must be 0 (off) or at least 200\n", drift_steps);
    return 2;
  }
  const auto options = bench::parse_training_step_options(
    "gpt_step", argc, argv, "char_lm,gpt", {"char_lm", "gpt", "gpt_wide"},
    std::string(TROUPE_SOURCE_DIR) + "/bench/peers/gpt_step_torch.py");
  if (!options)
    return 2;
  const auto& [device_name, where, models, python, peer_script, peers] = *options;
  if (bench::said_no_device(*options, out))
    return 0;

  for (const auto& size : sizes) {
    if (!options->wants(size.name))
      continue;
    generator data{7};
    // One fixed batch: the loss must fall on it (the correctness column).
    auto ids = randint({size.batch, size.sequence}, data, 0, vocabulary, where);
    auto targets = randint({size.batch * size.sequence}, data, 0, vocabulary, where);
    trainer main_run(size, where);
    auto& model = main_run.model;
    auto train_step = [&] { return main_run.step(ids, targets); };

    std::optional<bench::peer_process> torch;
    if (peers)
      torch.emplace(std::vector<std::string>{python, peer_script,
                                             std::to_string(vocabulary), std::to_string(size.width),
                                             std::to_string(size.heads), std::to_string(size.blocks),
                                             std::to_string(size.sequence), std::to_string(size.batch), device_name,
                                             fmt::format("{}", size.lr), std::to_string(threads)});
    bool have_peer =
      torch && torch->started() && torch->read_line(300'000).value_or("").find("ready") != std::string::npos;
    if (peers && !have_peer)
      out.note("PyTorch peer unavailable for {} on {} (needs torch under {}); troupe alone", size.name, device_name, python);

    const auto case_name = fmt::format("{} (w{} h{} b{} s{} x{}) {:.1f}M params", size.name, size.width, size.heads,
                                       size.blocks, size.sequence, size.batch,
                                       static_cast<double>(model.parameter_count()) / 1e6);
    const auto samples = static_cast<double>(size.batch);
    auto result = bench::time_training_steps(train_step, have_peer ? &*torch : nullptr, rounds, steps, case_name,
                                             samples, where, threads, out);
    const auto& ours = result.times.ours;
    const auto& theirs = result.times.theirs;
    const auto& r = result.samples;
    double last_loss = result.last_loss;
    out.add(r);
    const auto tokens = samples * static_cast<double>(size.sequence);
    out.add({case_name, "tokens/s", tokens / bench::median(ours), "tokens/s", r.baseline,
             r.baseline_value ? std::optional<double>(tokens / bench::median(theirs)) : std::nullopt, ""});

    if (drift_steps > 0 && std::string_view(size.name) == "char_lm") {
      for (auto step = static_cast<int>(ours.size()) + 2; step < drift_steps - 20; ++step)
        last_loss = train_step();
      trainer early(size, where);
      for (int step = 0; step < 90; ++step)
        early.step(ids, targets);
      std::vector<double> around_100, last_20;
      auto timed = [](auto&& step) {
        const auto start = bench::now_seconds();
        step();
        return bench::now_seconds() - start;
      };
      for (int k = 0; k < 20; ++k) {
        around_100.push_back(timed([&] { early.step(ids, targets); }));
        last_20.push_back(timed([&] { last_loss = train_step(); }));
      }
      out.add({case_name, fmt::format("step time @{}", drift_steps), bench::median(last_20) * 1e3, "ms",
               "troupe @100, alternated", bench::median(around_100) * 1e3,
               fmt::format("loss at step {}: {:.4f}{}", drift_steps, last_loss, std::isfinite(last_loss) ? "" : " WRONG")});
    }
  }
  out.print();
}
