#include "troupe/autograd/nn/transformer_block.hpp"

#include "troupe/autograd/functions.hpp"
#include "troupe/autograd/nn/gelu.hpp"

namespace troupe::nn {

transformer_block::transformer_block(const attention_options& options) {
  auto d = options.n_embd;
  ln_1_ = register_module("ln_1", make<layer_norm>(layer_norm_options{.normalized_size = d, .type = options.type}));
  attn_ = register_module("attn", make<causal_self_attention>(options));
  ln_2_ = register_module("ln_2", make<layer_norm>(layer_norm_options{.normalized_size = d, .type = options.type}));
  mlp_ = register_module(
    "mlp",
    make<sequential>(std::initializer_list<module_ptr>{
      make<linear>(linear_options{.in_features = d, .out_features = 4 * d, .type = options.type, .seed = options.seed}),
      make<gelu>(),
      make<linear>(linear_options{.in_features = 4 * d, .out_features = d, .type = options.type, .seed = options.seed}),
      make<nn::dropout>(options.dropout)}));
  reset_parameters(options.seed);
}

variable transformer_block::forward(const variable& input) {
  auto x = input + (*attn_)((*ln_1_)(input));
  return x + (*mlp_)((*ln_2_)(x));
}

} // namespace troupe::nn
