#include "troupe/autograd/nn/gpt.hpp"

#include "troupe/autograd/functions.hpp"

namespace troupe::nn {

gpt_embedding::gpt_embedding(const gpt_config& config) : config_(config) {
  require(config.vocab_size > 0 && config.block_size > 0 && config.n_embd > 0,
          "gpt: vocab_size {}, block_size {} and n_embd {} must be positive", config.vocab_size,
          config.block_size, config.n_embd);
  wte_ = register_module("wte", make<embedding>(embedding_options{.num_embeddings = config.vocab_size,
                                                                   .embedding_dim = config.n_embd,
                                                                   .type = config.type,
                                                                   .seed = config.seed}));
  wpe_ = register_module("wpe", make<embedding>(embedding_options{.num_embeddings = config.block_size,
                                                                   .embedding_dim = config.n_embd,
                                                                   .type = config.type,
                                                                   .seed = config.seed}));
  drop_ = register_module("drop", make<nn::dropout>(config.dropout));
  reset_parameters(config.seed);
}

variable gpt_embedding::forward(const variable& ids) {
  const auto& tokens = ids.data();
  require(tokens.rank() == 2 && tokens.type() == dtype::int64,
          "gpt: token ids must be int64 [batch, seq], got {} {}", tokens.type(), tokens.shape());
  auto seq = tokens.size(1);
  require(seq >= 1 && seq <= config_.block_size, "gpt: sequence length is {} but must be in [1, {}]", seq,
          config_.block_size);
  auto positions = troupe::arange(0.0, static_cast<double>(seq)).to(tokens.where());
  return (*drop_)(wte_->forward(tokens) + wpe_->forward(positions));
}

gpt_head::gpt_head(const gpt_config& config) {
  ln_f_ = register_module(
    "ln_f", make<layer_norm>(layer_norm_options{.normalized_size = config.n_embd, .type = config.type}));
  lm_head_ = register_module("lm_head", make<linear>(linear_options{.in_features = config.n_embd,
                                                                     .out_features = config.vocab_size,
                                                                     .bias = false,
                                                                     .type = config.type,
                                                                     .seed = config.seed}));
  reset_parameters(config.seed);
}

variable gpt_head::forward(const variable& x) {
  return (*lm_head_)((*ln_f_)(x));
}

gpt::gpt(const gpt_config& config) : config_(config) {
  require(config.n_layer >= 0, "gpt: n_layer is {} but must be >= 0", config.n_layer);
  append(make<gpt_embedding>(config));
  for (std::int64_t i = 0; i < config.n_layer; ++i)
    append(make<transformer_block>(attention_options{.n_embd = config.n_embd,
                                                     .n_head = config.n_head,
                                                     .dropout = config.dropout,
                                                     .type = config.type,
                                                     .seed = config.seed}));
  append(make<gpt_head>(config));
  reset_parameters(config.seed);
}

} // namespace troupe::nn
