#pragma once
// The models the benchmarks train beside PyTorch, in one place: the MLP of
// docs/baselines.md and the GPT sizes of bench/gpt_step (the PyTorch side of
// each: bench/peers/rpc_pipeline.py, ddp_torch.py and gpt_step_torch.py).
// bench/pipeline and bench/data_parallel take either with --model=mlp|gpt:
// a `workload` is the recipe every process builds its model, optimizer and
// loss from (the same parameters from the same seed) and one fixed batch.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "report.hpp"
#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/gpt.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/relu.hpp"
#include "troupe/parallel/remote.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::bench {

/// A GPT of bench/gpt_step: `name`'s width, heads, blocks, sequence, batch
/// and AdamW learning rate (weight decay 0.01); vocabulary gpt_vocabulary.
struct gpt_size {
  const char* name;
  std::int64_t width, heads, blocks, sequence, batch;
  double lr; ///< AdamW's; the wide model diverges at the small ones' 3e-3
};

inline constexpr gpt_size gpt_sizes[] = {
  {"char_lm", 64, 4, 2, 64, 16, 3e-3},
  {"gpt", 256, 8, 6, 128, 16, 3e-3},
  {"gpt_wide", 2560, 8, 6, 128, 16, 3e-4},
};
inline constexpr std::int64_t gpt_vocabulary = 86;
inline constexpr double gpt_weight_decay = 0.01;

inline nn::gpt_config gpt_config_of(const gpt_size& size) {
  return {.vocab_size = gpt_vocabulary, .block_size = size.sequence, .n_layer = size.blocks,
          .n_head = size.heads, .n_embd = size.width, .seed = 1};
}

/// What a benchmark trains: the recipe (model, optimizer, loss) every process
/// builds from, and one fixed batch of `batch` rows (inputs x, targets y).
struct workload {
  std::string name; ///< for table headers: "MLP 8x1024", "GPT w256 h8 b6 s128"
  parallel::stage_recipe recipe;
  std::int64_t batch = 0;
  tensor x, y;
};

/// docs/baselines.md's MLP: 8 x (Linear(1024, 1024) + ReLU), MSE, SGD lr
/// 0.05, batch 256; x and y normal(0, 1) from `data_seed`.
inline workload mlp_workload(std::uint64_t data_seed) {
  static constexpr std::int64_t dim = 1024, layers = 8, batch = 256;
  auto model = [] {
    auto m = std::make_shared<nn::sequential>();
    for (std::int64_t i = 0; i < layers; ++i) {
      m->append(nn::make<nn::linear>(dim, dim, /*seed=*/0));
      m->append(nn::make<nn::relu>());
    }
    m->reset_parameters(0);
    return m;
  };
  generator data{data_seed};
  auto x = randn({batch, dim}, data);
  auto y = randn({batch, dim}, data);
  return {"MLP 8x1024", {model, parallel::sgd_factory({.lr = 0.05}), parallel::mse_loss_function()}, batch, x, y};
}

/// bench/gpt_step's `gpt` size (6 blocks, width 256, 8 heads, sequence 128,
/// batch 16, vocabulary 86; a sequential of 8 layers: embedding, blocks,
/// head), AdamW(lr 3e-3, weight decay 0.01), cross entropy from the logits;
/// x token ids [16, 128] and y next-token targets [16, 128] drawn from
/// `data_seed`.
/// `size` picks another of gpt_sizes (gpt_wide: width 2560, AdamW lr 3e-4).
inline workload gpt_workload(std::uint64_t data_seed, const gpt_size& size = gpt_sizes[1]) {
  const auto config = gpt_config_of(size);
  auto model = [config] { return std::static_pointer_cast<nn::sequential>(std::make_shared<nn::gpt>(config)); };
  auto loss = [](const autograd::variable& logits, const tensor& targets) {
    return autograd::cross_entropy(autograd::reshape(logits, {-1, gpt_vocabulary}), targets.reshape({-1}));
  };
  generator data{data_seed};
  auto x = randint({size.batch, size.sequence}, data, 0, gpt_vocabulary);
  auto y = randint({size.batch, size.sequence}, data, 0, gpt_vocabulary);
  return {fmt::format("GPT w{} h{} b{} s{}", size.width, size.heads, size.blocks, size.sequence),
          {model, parallel::adam_factory({.lr = size.lr, .weight_decay = gpt_weight_decay}, /*decoupled=*/true), loss},
          size.batch, x, y};
}

/// `--model=mlp|gpt` (default mlp), and gpt_wide where `with_wide` (a GPU
/// size: no PyTorch peer script knows it); anything else is reported, naming
/// the option, and ends the program with 2.
inline std::string model_option(int argc, char** argv, bool with_wide = false) {
  command_line flags(argc, argv);
  auto model = with_wide ? flags.choice("model", "mlp", {"mlp", "gpt", "gpt_wide"})
                         : flags.choice("model", "mlp", {"mlp", "gpt"});
  exit_on_bad_value(flags);
  return model;
}

/// model_option's workload; `data_seed` as above.
inline workload workload_named(std::string_view model, std::uint64_t data_seed) {
  if (model == "gpt_wide")
    return gpt_workload(data_seed, gpt_sizes[2]);
  return model == "gpt" ? gpt_workload(data_seed) : mlp_workload(data_seed);
}

} // namespace troupe::bench
