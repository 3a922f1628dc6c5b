#pragma once
// The corpus of the examples: every license text Debian ships
// (/usr/share/common-licenses, regular files in name order), one token per
// distinct byte in byte order, and the char-level GPT recipe every rank of
// the distributed demos builds from the same seed.
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
  std::size_t files = 0; ///< 0: `directory` held no regular file (or could not be read)
  std::size_t characters = 0;
  std::int64_t vocab = 0;
  std::string bytes; ///< token id -> byte
  std::array<int, 256> token_of{}; ///< byte -> token id (-1: not in the corpus)
  tensor ids;        ///< int64 token ids

  explicit license_corpus(const std::filesystem::path& directory = "/usr/share/common-licenses") {
    std::error_code ec;
    std::vector<std::filesystem::path> paths;
    for (const auto& entry : std::filesystem::directory_iterator(directory, ec))
      if (entry.is_regular_file() && !entry.is_symlink()) paths.push_back(entry.path());
    if (ec) paths.clear();
    std::sort(paths.begin(), paths.end());
    std::string text;
    for (const auto& f : paths) {
      std::ifstream in(f, std::ios::binary);
      text.append(std::istreambuf_iterator<char>(in), {});
    }
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    token_of.fill(-1);
    for (int c = 0; c < 256; ++c)
      if (seen[c]) token_of[c] = int(vocab++), bytes.push_back(char(c));
    std::vector<std::int64_t> tokens(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = token_of[static_cast<unsigned char>(text[i])];
    files = paths.size();
    characters = text.size();
    ids = tensor::from(tokens, {std::int64_t(tokens.size())});
  }

  /// `batch` random windows of `seq` tokens starting in [begin, end - seq - 1)
  /// (end < 0: the whole corpus), and the windows shifted by one.
  std::pair<tensor, tensor> batch(generator& gen, std::int64_t batch, std::int64_t seq, std::int64_t begin = 0,
                                  std::int64_t end = -1) const {
    if (end < 0) end = ids.numel();
    auto starts = randint({batch}, gen, begin, end - seq - 1).to_vector<std::int64_t>();
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
