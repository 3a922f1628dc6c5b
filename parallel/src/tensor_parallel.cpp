// Tensor-parallel layers (tensor_parallel.hpp).
#include "troupe/parallel/tensor_parallel.hpp"

#include <cmath>

#include "troupe/autograd/functions.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"

#include "reducer_member.hpp"

namespace troupe::parallel {

// -- the shared part -----------------------------------------------------------------------------

sharded_linear::sharded_linear(const nn::linear_options& whole, reducer_group& group, std::int64_t split_dim,
                               const char* layer)
    : whole_(whole), group_(reducer_group_access::share(group)), split_dim_(split_dim) {
  require(whole.in_features > 0 && whole.out_features > 0, "{}: sizes must be positive, got in_features {} and "
          "out_features {}", layer, whole.in_features, whole.out_features);
  const bool by_output = split_dim == 0;
  features_ = tensor_parallel_split(by_output ? whole.out_features : whole.in_features, group.size(), group.rank());
  const dims weight_shape = by_output ? dims{features_.size, whole.in_features} : dims{whole.out_features, features_.size};
  weight_ = register_parameter("weight", autograd::variable(tensor::zeros(weight_shape, whole.type)));
  if (whole.bias)
    bias_ = register_parameter("bias", autograd::variable(tensor::zeros({by_output ? features_.size : whole.out_features},
                                                                        whole.type)));
  reset_parameters(whole.seed);
}

void sharded_linear::init_parameter(const std::string& name, tensor& data, generator& gen) {
  // nn::linear's rule: uniform in ±1/sqrt(in_features) for weight and
  // bias, drawn for the whole parameter from the same generator, so that
  // this rank's piece is the one-process layer's piece.
  const double bound = 1.0 / std::sqrt(static_cast<double>(whole_.in_features));
  const bool is_weight = name == "weight";
  auto value = rand(is_weight ? dims{whole_.out_features, whole_.in_features} : dims{whole_.out_features}, gen, -bound,
                    bound, whole_.type);
  if (is_weight || split_dim_ == 0)
    value = value.slice(is_weight ? split_dim_ : 0, features_.offset, features_.offset + features_.size);
  data.copy_from(value);
}

std::vector<parameter_shard> sharded_linear::shards() const {
  std::vector<parameter_shard> out{{"weight", {whole_.out_features, whole_.in_features}, split_dim_, features_.offset}};
  if (whole_.bias)
    out.push_back(split_dim_ == 0 ? parameter_shard{"bias", {whole_.out_features}, 0, features_.offset}
                                  : parameter_shard{"bias", {whole_.out_features}, -1, 0});
  return out;
}

// -- column and row parallel ----------------------------------------------------------------------

column_parallel_linear::column_parallel_linear(const nn::linear_options& whole, reducer_group& group,
                                               column_parallel_options options)
    : sharded_linear(whole, group, 0, "column_parallel_linear"), options_(options) {}

autograd::variable column_parallel_linear::forward(const autograd::variable& input) {
  auto mine = autograd::linear(copy_to_group(input, group_), weight_, bias_);
  return options_.gather_output ? gather_from_group(mine, group_, -1, whole_.out_features) : mine;
}

row_parallel_linear::row_parallel_linear(const nn::linear_options& whole, reducer_group& group,
                                         row_parallel_options options)
    : sharded_linear(whole, group, 1, "row_parallel_linear"), options_(options) {}

autograd::variable row_parallel_linear::forward(const autograd::variable& input) {
  auto mine = options_.input_is_parallel ? input : scatter_to_group(input, group_, -1);
  // The bias joins after the sum, once: every rank adds the same values.
  auto summed = reduce_from_group(autograd::linear(mine, weight_, autograd::variable{}), group_);
  return whole_.bias ? autograd::add(summed, bias_) : summed;
}

// -- MLP ------------------------------------------------------------------------------------------

parallel_mlp::parallel_mlp(const parallel_mlp_options& options, reducer_group& group) {
  const auto hidden = options.hidden > 0 ? options.hidden : 4 * options.width;
  fc_ = register_module("fc", std::make_shared<column_parallel_linear>(
                                  nn::linear_options{.in_features = options.width, .out_features = hidden,
                                                     .type = options.type},
                                  group));
  proj_ = register_module("proj", std::make_shared<row_parallel_linear>(
                                      nn::linear_options{.in_features = hidden, .out_features = options.width,
                                                         .type = options.type},
                                      group));
  reset_parameters(options.seed); // by FQN ("fc.weight"), as the one-process MLP
}

autograd::variable parallel_mlp::forward(const autograd::variable& input) {
  return (*proj_)(autograd::gelu((*fc_)(input)));
}

} // namespace troupe::parallel
