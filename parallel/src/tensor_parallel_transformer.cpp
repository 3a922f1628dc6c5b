// The GPT split over a tensor-parallel group (tensor_parallel_transformer.hpp).
#include "troupe/parallel/tensor_parallel_transformer.hpp"

#include <optional>

#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/dropout.hpp"
#include "troupe/autograd/nn/embedding.hpp"
#include "troupe/autograd/nn/gelu.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
#include "troupe/parallel/vocab_parallel.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"

#include "reducer_member.hpp"

namespace troupe::parallel {

using autograd::variable;

// -- layer norm ----------------------------------------------------------------------------------

sequence_parallel_layer_norm::sequence_parallel_layer_norm(const nn::layer_norm_options& options,
                                                           reducer_group& group)
    : nn::layer_norm(options), group_(reducer_group_access::share(group)) {
  require(options.elementwise_affine, "sequence_parallel_layer_norm: without affine parameters use nn::layer_norm");
}

variable sequence_parallel_layer_norm::forward(const variable& input) {
  // copy_to_group: the parameters as they are forward, their gradients
  // (this piece of the sequence's) summed over the group backward.
  return autograd::layer_norm(input, copy_to_group(weight(), group_), copy_to_group(bias(), group_), options().eps);
}

namespace {

/// The block's layer norm: on pieces of the sequence with sequence parallelism.
nn::module_ptr block_layer_norm(std::int64_t size, dtype type, reducer_group& group, tensor_parallel_options parallel) {
  const nn::layer_norm_options options{.normalized_size = size, .type = type};
  if (parallel.sequence_parallel)
    return std::make_shared<sequence_parallel_layer_norm>(options, group);
  return std::make_shared<nn::layer_norm>(options);
}

std::optional<std::int64_t> sequence_dim(tensor_parallel_options parallel) {
  return parallel.sequence_parallel ? std::optional<std::int64_t>(1) : std::nullopt;
}

} // namespace

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

parallel_self_attention::parallel_self_attention(const nn::attention_options& options, reducer_group& group,
                                                 tensor_parallel_options parallel)
    : options_(options), parallel_(parallel), group_(reducer_group_access::share(group)),
      heads_(heads_of(options, group)) {
  const auto embd = options.n_embd, head_size = embd / options.n_head;
  const shard_range columns{heads_.offset * head_size, heads_.size * head_size};
  // c_attn's output features are q, then k, then v, each heads side by side.
  std::vector<shard_range> qkv;
  for (std::int64_t part = 0; part < 3; ++part)
    qkv.push_back({part * embd + columns.offset, columns.size});
  c_attn_ = register_module("c_attn", std::make_shared<column_parallel_linear>(
                                          nn::linear_options{.in_features = embd, .out_features = 3 * embd,
                                                             .type = options.type, .seed = options.seed},
                                          group, column_parallel_options{.pieces = qkv, .sequence_dim = sequence_dim(parallel)}));
  c_proj_ = register_module("c_proj", std::make_shared<row_parallel_linear>(
                                          nn::linear_options{.in_features = embd, .out_features = embd,
                                                             .type = options.type, .seed = options.seed},
                                          group, row_parallel_options{.pieces = {columns}, .sequence_dim = sequence_dim(parallel)}));
  attn_dropout_ = register_module("attn_dropout", std::make_shared<nn::dropout>(options.dropout));
  resid_dropout_ = register_module("resid_dropout", std::make_shared<nn::dropout>(options.dropout));
  reset_parameters(options.seed);
}

variable parallel_self_attention::forward(const variable& x) {
  require(x.data().rank() == 3 && x.size(2) == options_.n_embd,
          "parallel_self_attention: input must be [batch, seq, {}], got {}", options_.n_embd, x.shape());
  const auto head_size = options_.n_embd / options_.n_head;
  // c_attn sees the whole sequence (gathered first with sequence
  // parallelism); c_proj sums the heads' outputs over the group.
  auto y = nn::causal_attention((*c_attn_)(x), heads_.size, head_size, *attn_dropout_);
  return (*resid_dropout_)((*c_proj_)(y));
}

// -- block ---------------------------------------------------------------------------------------

parallel_transformer_block::parallel_transformer_block(const nn::attention_options& options, reducer_group& group,
                                                       tensor_parallel_options parallel) {
  const auto d = options.n_embd;
  ln_1_ = register_module("ln_1", block_layer_norm(d, options.type, group, parallel));
  attn_ = register_module("attn", std::make_shared<parallel_self_attention>(options, group, parallel));
  ln_2_ = register_module("ln_2", block_layer_norm(d, options.type, group, parallel));
  mlp_ = register_module(
      "mlp", std::make_shared<nn::sequential>(std::initializer_list<nn::module_ptr>{
                 std::make_shared<column_parallel_linear>(
                     nn::linear_options{.in_features = d, .out_features = 4 * d, .type = options.type}, group,
                     column_parallel_options{.sequence_dim = sequence_dim(parallel)}),
                 std::make_shared<nn::gelu>(),
                 std::make_shared<row_parallel_linear>(
                     nn::linear_options{.in_features = 4 * d, .out_features = d, .type = options.type}, group,
                     row_parallel_options{.sequence_dim = sequence_dim(parallel)}),
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
  parallel_gpt_embedding(const nn::gpt_config& config, reducer_group& group, tensor_parallel_options parallel)
      : config_(config), parallel_(parallel), group_(reducer_group_access::share(group)) {
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
    auto x = (*drop_)((*wte_)(ids) + wpe_->forward(positions));
    // Sequence parallelism: the blocks take this rank's piece of the sequence.
    return parallel_.sequence_parallel ? scatter_to_group(x, group_, 1) : x;
  }

private:
  nn::gpt_config config_;
  tensor_parallel_options parallel_;
  reducer_group group_;
  std::shared_ptr<vocab_parallel_embedding> wte_;
  std::shared_ptr<nn::embedding> wpe_;
  std::shared_ptr<nn::module> drop_;
};

/// nn::gpt_head with the classes split by vocabulary.
class parallel_gpt_head : public nn::module {
public:
  parallel_gpt_head(const nn::gpt_config& config, reducer_group& group, tensor_parallel_options parallel) {
    ln_f_ = register_module("ln_f", block_layer_norm(config.n_embd, config.type, group, parallel));
    lm_head_ = register_module("lm_head", std::make_shared<column_parallel_linear>(
                                              nn::linear_options{.in_features = config.n_embd,
                                                                 .out_features = config.vocab_size, .bias = false,
                                                                 .type = config.type},
                                              group, column_parallel_options{.sequence_dim = sequence_dim(parallel)}));
  }
  /// The whole sequence's logits, this rank's classes.
  variable forward(const variable& x) override { return (*lm_head_)((*ln_f_)(x)); }

private:
  std::shared_ptr<nn::module> ln_f_, lm_head_;
};

} // namespace

parallel_gpt::parallel_gpt(const nn::gpt_config& config, reducer_group& group, tensor_parallel_options parallel)
    : config_(config) {
  require(config.n_layer >= 0, "parallel_gpt: n_layer is {} but must be >= 0", config.n_layer);
  append(std::make_shared<parallel_gpt_embedding>(config, group, parallel));
  for (std::int64_t i = 0; i < config.n_layer; ++i)
    append(std::make_shared<parallel_transformer_block>(nn::attention_options{.n_embd = config.n_embd,
                                                                              .n_head = config.n_head,
                                                                              .dropout = config.dropout,
                                                                              .type = config.type,
                                                                              .seed = config.seed},
                                                        group, parallel));
  append(std::make_shared<parallel_gpt_head>(config, group, parallel));
  reset_parameters(config.seed);
}

} // namespace troupe::parallel
