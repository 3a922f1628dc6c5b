// The GPT split over a tensor-parallel group (tensor_parallel_transformer.hpp).
#include "troupe/parallel/tensor_parallel_transformer.hpp"

#include <cmath>
#include <limits>

#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/dropout.hpp"
#include "troupe/autograd/nn/embedding.hpp"
#include "troupe/autograd/nn/gelu.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
#include "troupe/parallel/vocab_parallel.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::parallel {

using autograd::variable;

// -- attention -----------------------------------------------------------------------------------

namespace {

shard_range heads_of(const nn::attention_options& o, reducer_group& group) {
  require(o.n_embd > 0 && o.n_head > 0 && o.n_embd % o.n_head == 0,
          "parallel_self_attention: n_head {} must divide n_embd {}", o.n_head, o.n_embd);
  require(o.n_head >= group.size(), "parallel_self_attention: {} heads over {} ranks leave a rank without a head",
          o.n_head, group.size());
  return tensor_parallel_split(o.n_head, group.size(), group.rank());
}

} // namespace

parallel_self_attention::parallel_self_attention(const nn::attention_options& options, reducer_group& group)
    : options_(options), heads_(heads_of(options, group)) {
  const auto embd = options.n_embd, head_size = embd / options.n_head;
  const shard_range columns{heads_.offset * head_size, heads_.size * head_size};
  // c_attn's output features are q, then k, then v, each heads side by side.
  std::vector<shard_range> qkv;
  for (std::int64_t part = 0; part < 3; ++part)
    qkv.push_back({part * embd + columns.offset, columns.size});
  c_attn_ = register_module("c_attn", std::make_shared<column_parallel_linear>(
                                          nn::linear_options{.in_features = embd, .out_features = 3 * embd,
                                                             .type = options.type, .seed = options.seed},
                                          group, column_parallel_options{.pieces = qkv}));
  c_proj_ = register_module("c_proj", std::make_shared<row_parallel_linear>(
                                          nn::linear_options{.in_features = embd, .out_features = embd,
                                                             .type = options.type, .seed = options.seed},
                                          group, row_parallel_options{.pieces = {columns}}));
  attn_dropout_ = register_module("attn_dropout", std::make_shared<nn::dropout>(options.dropout));
  resid_dropout_ = register_module("resid_dropout", std::make_shared<nn::dropout>(options.dropout));
  reset_parameters(options.seed);
}

variable parallel_self_attention::forward(const variable& x) {
  require(x.data().rank() == 3 && x.size(2) == options_.n_embd,
          "parallel_self_attention: input must be [batch, seq, {}], got {}", options_.n_embd, x.shape());
  const auto batch = x.size(0), seq = x.size(1);
  const auto heads = heads_.size, head_size = options_.n_embd / options_.n_head;
  auto qkv = autograd::split((*c_attn_)(x), heads * head_size, 2);
  auto to_heads = [&](const variable& t) {
    auto split_heads = autograd::reshape(t, {batch, seq, heads, head_size});
    return autograd::reshape(autograd::permute(split_heads, {0, 2, 1, 3}), {batch * heads, seq, head_size});
  };
  auto q = to_heads(qkv[0]), k = to_heads(qkv[1]), v = to_heads(qkv[2]);
  if (!mask_.defined() || mask_.size(0) != seq || mask_.where() != x.data().where()) {
    auto mask = tensor::zeros({seq, seq}, dtype::float64);
    auto* values = mask.data<double>();
    for (std::int64_t row = 0; row < seq; ++row)
      for (std::int64_t col = row + 1; col < seq; ++col)
        values[row * seq + col] = -std::numeric_limits<double>::infinity();
    mask_ = mask.to(options_.type).to(x.data().where());
  }
  auto scores = autograd::bmm(q, autograd::transpose(k, 1, 2)) * (1.0 / std::sqrt(static_cast<double>(head_size)));
  auto weights = (*attn_dropout_)(autograd::softmax(scores + variable(mask_), -1));
  auto y = autograd::bmm(weights, v);
  y = autograd::permute(autograd::reshape(y, {batch, heads, seq, head_size}), {0, 2, 1, 3});
  return (*resid_dropout_)((*c_proj_)(autograd::reshape(y, {batch, seq, heads * head_size})));
}

// -- block ---------------------------------------------------------------------------------------

parallel_transformer_block::parallel_transformer_block(const nn::attention_options& options, reducer_group& group) {
  const auto d = options.n_embd;
  ln_1_ = register_module("ln_1", std::make_shared<nn::layer_norm>(nn::layer_norm_options{.normalized_size = d,
                                                                                       .type = options.type}));
  attn_ = register_module("attn", std::make_shared<parallel_self_attention>(options, group));
  ln_2_ = register_module("ln_2", std::make_shared<nn::layer_norm>(nn::layer_norm_options{.normalized_size = d,
                                                                                       .type = options.type}));
  mlp_ = register_module(
      "mlp", std::make_shared<nn::sequential>(std::initializer_list<nn::module_ptr>{
                 std::make_shared<column_parallel_linear>(
                     nn::linear_options{.in_features = d, .out_features = 4 * d, .type = options.type}, group),
                 std::make_shared<nn::gelu>(),
                 std::make_shared<row_parallel_linear>(
                     nn::linear_options{.in_features = 4 * d, .out_features = d, .type = options.type}, group),
                 std::make_shared<nn::dropout>(options.dropout)}));
  reset_parameters(options.seed);
}

variable parallel_transformer_block::forward(const variable& input) {
  auto x = input + (*attn_)((*ln_1_)(input));
  return x + (*mlp_)((*ln_2_)(x));
}

// -- GPT -----------------------------------------------------------------------------------------

namespace {

/// nn::gpt_embedding with the token table split by vocabulary.
class parallel_gpt_embedding : public nn::module {
public:
  parallel_gpt_embedding(const nn::gpt_config& config, reducer_group& group) : config_(config) {
    wte_ = register_module("wte", std::make_shared<vocab_parallel_embedding>(
                                      nn::embedding_options{.num_embeddings = config.vocab_size,
                                                            .embedding_dim = config.n_embd, .type = config.type},
                                      group));
    wpe_ = register_module("wpe", std::make_shared<nn::embedding>(
                                      nn::embedding_options{.num_embeddings = config.block_size,
                                                            .embedding_dim = config.n_embd, .type = config.type}));
    drop_ = register_module("drop", std::make_shared<nn::dropout>(config.dropout));
  }
  variable forward(const variable& ids) override {
    const auto& tokens = ids.data();
    require(tokens.rank() == 2 && tokens.type() == dtype::int64,
            "parallel_gpt: token ids must be int64 [batch, seq], got {} {}", tokens.type(), tokens.shape());
    const auto seq = tokens.size(1);
    require(seq >= 1 && seq <= config_.block_size, "parallel_gpt: sequence length is {} but must be in [1, {}]", seq,
            config_.block_size);
    auto positions = arange(0.0, static_cast<double>(seq)).to(tokens.where());
    return (*drop_)((*wte_)(ids) + wpe_->forward(positions));
  }

private:
  nn::gpt_config config_;
  std::shared_ptr<vocab_parallel_embedding> wte_;
  std::shared_ptr<nn::embedding> wpe_;
  std::shared_ptr<nn::module> drop_;
};

/// nn::gpt_head with the classes split by vocabulary.
class parallel_gpt_head : public nn::module {
public:
  parallel_gpt_head(const nn::gpt_config& config, reducer_group& group) {
    ln_f_ = register_module("ln_f", std::make_shared<nn::layer_norm>(
                                        nn::layer_norm_options{.normalized_size = config.n_embd, .type = config.type}));
    lm_head_ = register_module("lm_head", std::make_shared<column_parallel_linear>(
                                              nn::linear_options{.in_features = config.n_embd,
                                                                 .out_features = config.vocab_size, .bias = false,
                                                                 .type = config.type},
                                              group));
  }
  variable forward(const variable& x) override { return (*lm_head_)((*ln_f_)(x)); }

private:
  std::shared_ptr<nn::module> ln_f_, lm_head_;
};

} // namespace

parallel_gpt::parallel_gpt(const nn::gpt_config& config, reducer_group& group) : config_(config) {
  require(config.n_layer >= 0, "parallel_gpt: n_layer is {} but must be >= 0", config.n_layer);
  append(std::make_shared<parallel_gpt_embedding>(config, group));
  for (std::int64_t i = 0; i < config.n_layer; ++i)
    append(std::make_shared<parallel_transformer_block>(nn::attention_options{.n_embd = config.n_embd,
                                                                              .n_head = config.n_head,
                                                                              .dropout = config.dropout,
                                                                              .type = config.type,
                                                                              .seed = config.seed},
                                                        group));
  append(std::make_shared<parallel_gpt_head>(config, group));
  reset_parameters(config.seed);
}

} // namespace troupe::parallel
