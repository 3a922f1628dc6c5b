#pragma once
// The corpus of the distributed demos: every license text Debian ships
// (/usr/share/common-licenses, regular files in name order), one token per
// distinct byte, and the char-level GPT recipe every rank builds from the
// same seed.
#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/gpt.hpp"
#include "troupe/parallel/remote.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::examples {

struct license_corpus {
  std::size_t characters = 0;
  std::int64_t vocab = 0;
  tensor ids; ///< int64 token ids

  license_corpus() {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses"))
      if (entry.is_regular_file() && !entry.is_symlink()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      text.append(std::istreambuf_iterator<char>(in), {});
    }
    std::array<int, 256> index_of{};
    index_of.fill(-1);
    for (unsigned char c : text) if (index_of[c] < 0) index_of[c] = 0;
    for (auto& i : index_of) if (i == 0) i = int(vocab++);
    std::vector<std::int64_t> tokens(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = index_of[static_cast<unsigned char>(text[i])];
    characters = text.size();
    ids = tensor::from(tokens, {std::int64_t(tokens.size())});
  }

  /// `batch` random windows of `seq` tokens and the windows shifted by one.
  std::pair<tensor, tensor> batch(generator& gen, std::int64_t batch, std::int64_t seq) const {
    auto starts = randint({batch}, gen, 0, ids.numel() - seq - 1).to_vector<std::int64_t>();
    std::vector<tensor> xs, ys;
    for (auto s : starts) xs.push_back(ids.narrow(0, s, seq)), ys.push_back(ids.narrow(0, s + 1, seq));
    return {stack(xs, 0), stack(ys, 0)};
  }

  /// The demo GPT (4 blocks of width 64, context 64): a sequential of 6 layers.
  nn::gpt_config gpt() const {
    return {.vocab_size = vocab, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 64, .dropout = 0.0, .seed = 1};
  }

  /// Model, AdamW and cross entropy, the same on every rank.
  parallel::stage_recipe recipe() const {
    auto config = gpt();
    auto v = vocab;
    return {[config] { return std::static_pointer_cast<nn::sequential>(std::make_shared<nn::gpt>(config)); },
            parallel::adam_factory({.lr = 3e-3, .weight_decay = 0.01}, true),
            [v](const autograd::variable& logits, const tensor& targets) {
              return autograd::cross_entropy(autograd::reshape(logits, {-1, v}), targets.reshape({-1}));
            }};
  }
};

} // namespace troupe::examples
