// A character-level GPT trained on the license texts every Debian machine
// ships (/usr/share/common-licenses), in one process: troupe's tensor,
// autograd, nn and optimizer modules end to end. Deterministic for a seed.
//
//   build/examples/char_lm [--steps=500] [--seed=1] [--data=DIR] [--save=FILE] [--threads=1]
//
// --threads=N gives every op N intra-op threads (one process uses N cores).
//
// Expected output (samples/s depends on the machine; losses do not):
//   char_lm: 14 files, 237320 characters, vocabulary 86, 2 layers, 115200 parameters
//   step    1  loss 4.6187  val 4.3450  samples/s 306.9
//   step   50  loss 2.6122  val 2.9687  samples/s 332.9
//   ...
//   step  500  loss 1.9019  val 2.3098  samples/s 333.1
//   sample: "The copyright of the of the License and the and the program the "
#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "license_corpus.hpp"
#include "troupe/command_line.hpp"
#include "troupe/autograd/backward.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/grad_mode.hpp"
#include "troupe/autograd/nn/gpt.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/serialization/checkpoint_file.hpp"
#include "troupe/tensor/intra_op_threads.hpp"

using namespace troupe;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  command_line cli(argc, argv);
  const auto steps = cli.integer("steps", 500, 1, 1'000'000);
  const auto seed = cli.integer("seed", 1, 0, INT64_MAX);
  const auto dir = cli.text("data", "/usr/share/common-licenses");
  const auto save = cli.text("save", "");
  const auto threads = cli.integer("threads", 1, 1, 256);
  if (auto usage = cli.finish(); !usage)
    return fmt::print(stderr, "char_lm: {}\n", usage.error().message()), 2;
  troupe::set_intra_op_threads(static_cast<int>(threads));

  const examples::license_corpus corpus(dir);
  if (corpus.files == 0) return fmt::print(stderr, "char_lm: no text files in '{}'\n", dir), 2;
  const std::int64_t split = corpus.ids.numel() * 9 / 10; // last 10%: validation

  nn::gpt_config config{.vocab_size = corpus.vocab, .block_size = 64, .n_layer = 2,
                        .n_head = 4, .n_embd = 64, .dropout = 0.0, .seed = std::uint64_t(seed)};
  auto model = std::make_shared<nn::gpt>(config);
  optim::adamw opt(model->named_parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  fmt::print("char_lm: {} files, {} characters, vocabulary {}, {} layers, {} parameters\n", corpus.files,
             corpus.characters, corpus.vocab, config.n_layer, model->parameter_count());

  // A batch: `batch` windows at offsets drawn from a counter-based stream,
  // so batch k is the same in any process for the same seed.
  constexpr std::int64_t batch = 16, seq = 64;
  generator data_gen{std::uint64_t(seed) + 1};
  auto windows = [&](std::int64_t begin, std::int64_t end, generator& gen) {
    return corpus.batch(gen, batch, seq, begin, end);
  };
  auto loss_on = [&](const std::pair<tensor, tensor>& xy) {
    auto logits = (*model)(autograd::variable(xy.first));
    return autograd::cross_entropy(autograd::reshape(logits, {-1, config.vocab_size}), xy.second.reshape({-1}));
  };
  auto validation_loss = [&] {
    autograd::no_grad_guard no_grad;
    generator val_gen{7}; // the same validation windows every time
    double total = 0;
    for (int i = 0; i < 4; ++i) total += loss_on(windows(split, corpus.ids.numel(), val_gen)).item();
    return total / 4;
  };

  auto started = std::chrono::steady_clock::now();
  for (std::int64_t step = 1; step <= steps; ++step) {
    opt.zero_grad();
    auto loss = loss_on(windows(0, split, data_gen));
    autograd::backward(loss);
    opt.step();
    if (step == 1 || step % 50 == 0 || step == steps) {
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      fmt::print("step {:4}  loss {:.4f}  val {:.4f}  samples/s {:.1f}\n", step, loss.item(), validation_loss(),
                 double(step * batch) / seconds);
    }
  }

  // Greedy continuation of a prompt, to see what it learned.
  autograd::no_grad_guard no_grad;
  std::string sample = "The ";
  for (int i = 0; i < 60; ++i) {
    std::vector<std::int64_t> context;
    for (char c : sample.substr(sample.size() > std::size_t(seq) ? sample.size() - seq : 0))
      context.push_back(std::max(corpus.token_of[static_cast<unsigned char>(c)], 0));
    auto logits = (*model)(autograd::variable(tensor::from(context, {1, std::int64_t(context.size())})));
    sample.push_back(corpus.bytes[std::size_t(argmax(logits.data().select(1, -1), -1).item())]);
  }
  fmt::print("sample: \"{}\"\n", sample);
  if (!save.empty()) {
    if (auto saved = save_checkpoint(save, model->state_dict()); !saved)
      return fmt::print(stderr, "char_lm: {}\n", saved.error().to_string()), 1;
    fmt::print("saved {} tensors to {}\n", model->state_dict().size(), save);
  }
}
