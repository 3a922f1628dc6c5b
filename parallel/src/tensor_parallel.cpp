// Tensor-parallel layers (tensor_parallel.hpp).
#include "troupe/parallel/tensor_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "troupe/autograd/functions.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"

#include "reducer_member.hpp"

namespace troupe::parallel {

// -- the shared part -----------------------------------------------------------------------------

sharded_linear::sharded_linear(const nn::linear_options& whole, reducer_group& group, std::int64_t split_dim,
                               std::vector<shard_range> pieces, const char* layer)
    : whole_(whole), group_(reducer_group_access::share(group)), split_dim_(split_dim), pieces_(std::move(pieces)) {
  require(whole.in_features > 0 && whole.out_features > 0, "{}: sizes must be positive, got in_features {} and "
          "out_features {}", layer, whole.in_features, whole.out_features);
  const bool by_output = split_dim == 0;
  const auto extent = by_output ? whole.out_features : whole.in_features;
  if (pieces_.empty())
    pieces_.push_back(tensor_parallel_split(extent, group.size(), group.rank()));
  std::int64_t held = 0;
  for (const auto& piece : pieces_) {
    require(piece.offset >= 0 && piece.size >= 0 && piece.offset + piece.size <= extent,
            "{}: piece [{}, {}) is outside the {} features", layer, piece.offset, piece.offset + piece.size, extent);
    held += piece.size;
  }
  const dims weight_shape = by_output ? dims{held, whole.in_features} : dims{whole.out_features, held};
  weight_ = register_parameter("weight", autograd::variable(tensor::zeros(weight_shape, whole.type)));
  if (whole.bias)
    bias_ = register_parameter("bias", autograd::variable(tensor::zeros({by_output ? held : whole.out_features},
                                                                        whole.type)));
  reset_parameters(whole.seed);
}

void sharded_linear::init_parameter(const std::string& name, tensor& data, generator& gen) {
  // nn::linear's rule: uniform in ±1/sqrt(in_features) for weight and
  // bias, drawn for the whole parameter from the same generator, so that
  // this rank's pieces are the one-process layer's pieces.
  const double bound = 1.0 / std::sqrt(static_cast<double>(whole_.in_features));
  const bool is_weight = name == "weight";
  auto value = rand(is_weight ? dims{whole_.out_features, whole_.in_features} : dims{whole_.out_features}, gen, -bound,
                    bound, whole_.type);
  if (!is_weight && split_dim_ != 0) { // a row-parallel bias: whole
    data.copy_from(value);
    return;
  }
  const auto dim = is_weight ? split_dim_ : 0;
  std::vector<tensor> parts;
  for (const auto& piece : pieces_)
    parts.push_back(value.slice(dim, piece.offset, piece.offset + piece.size));
  data.copy_from(cat(parts, dim));
}

std::vector<parameter_shard> sharded_linear::shards() const {
  std::vector<parameter_shard> out;
  const bool split_bias = whole_.bias && split_dim_ == 0;
  for (const char* name : {"weight", "bias"}) {
    const bool is_weight = name == std::string_view("weight");
    if (!is_weight && !whole_.bias)
      continue;
    const dims shape = is_weight ? dims{whole_.out_features, whole_.in_features} : dims{whole_.out_features};
    if (!is_weight && !split_bias) {
      out.push_back({name, shape, -1, 0, whole_.out_features, 0});
      continue;
    }
    std::int64_t local = 0;
    for (const auto& piece : pieces_) {
      out.push_back({name, shape, is_weight ? split_dim_ : 0, piece.offset, piece.size, local});
      local += piece.size;
    }
  }
  return out;
}

// -- column and row parallel ----------------------------------------------------------------------

column_parallel_linear::column_parallel_linear(const nn::linear_options& whole, reducer_group& group,
                                               column_parallel_options options)
    : sharded_linear(whole, group, 0, options.pieces, "column_parallel_linear"), options_(options) {
  require(!options.gather_output || options.pieces.empty(),
          "column_parallel_linear: gather_output joins tensor_parallel_split's pieces, not chosen ones");
}

autograd::variable column_parallel_linear::forward(const autograd::variable& input) {
  auto whole = options_.sequence_dim ? all_gather_from_group(input, group_, *options_.sequence_dim)
                                     : copy_to_group(input, group_);
  auto mine = autograd::linear(whole, weight_, bias_);
  return options_.gather_output ? gather_from_group(mine, group_, -1, whole_.out_features) : mine;
}

row_parallel_linear::row_parallel_linear(const nn::linear_options& whole, reducer_group& group,
                                         row_parallel_options options)
    : sharded_linear(whole, group, 1, options.pieces, "row_parallel_linear"), options_(options) {
  require(options.input_is_parallel || options.pieces.empty(),
          "row_parallel_linear: a whole input is split by tensor_parallel_split, not into chosen pieces");
  require(pieces_.size() == 1, "row_parallel_linear: one range of input features, got {}", pieces_.size());
}

autograd::variable row_parallel_linear::forward(const autograd::variable& input) {
  auto mine = options_.input_is_parallel ? input : scatter_to_group(input, group_, -1);
  // The bias joins after the sum, once: every rank adds the same values.
  auto partial = autograd::linear(mine, weight_, autograd::variable{});
  auto summed = options_.sequence_dim ? reduce_scatter_to_group(partial, group_, *options_.sequence_dim)
                                      : reduce_from_group(partial, group_);
  if (!whole_.bias)
    return summed;
  // With sequence parallelism each rank adds the bias to its piece only:
  // the gradient is summed over the group (copy_to_group) so that every
  // replica of the bias steps with the whole sequence's.
  return autograd::add(summed, options_.sequence_dim ? copy_to_group(bias_, group_) : bias_);
}

// -- whole models ---------------------------------------------------------------------------------

std::vector<std::pair<std::string, parameter_shard>> parameter_shards(nn::module& model) {
  std::multimap<std::string, parameter_shard> split; // by FQN; a parameter's pieces in order
  for (auto& [prefix, m] : model.named_modules())
    if (auto* sharded = dynamic_cast<sharded_module*>(m))
      for (auto& shard : sharded->shards())
        split.emplace(prefix.empty() ? shard.name : prefix + "." + shard.name, shard);
  std::vector<std::pair<std::string, parameter_shard>> out;
  for (auto& [fqn, parameter] : model.named_parameters()) {
    auto [first, last] = split.equal_range(fqn);
    if (first == last) { // held whole
      const auto& shape = parameter.data().shape();
      out.emplace_back(fqn, parameter_shard{fqn, shape, -1, 0, shape.empty() ? 1 : shape[0], 0});
    }
    for (auto it = first; it != last; ++it)
      out.emplace_back(fqn, it->second);
  }
  return out;
}

expected<void> pieces_equal(nn::module& model, const named_tensors& whole, double tolerance) {
  std::map<std::string, tensor> local;
  for (auto& [fqn, parameter] : model.named_parameters())
    local.emplace(fqn, parameter.data());
  for (auto& [fqn, shard] : parameter_shards(model)) {
    auto it = std::find_if(whole.begin(), whole.end(), [&](const auto& entry) { return entry.first == fqn; });
    if (it == whole.end())
      return make_error(errc::invalid_argument, "{}: not in the whole model's state", fqn);
    if (it->second.shape() != shard.global_shape)
      return make_error(errc::invalid_argument, "{}: the whole model's is {}, the split model's whole is {}", fqn,
                        it->second.shape(), shard.global_shape);
    auto mine = local.at(fqn);
    auto want = it->second;
    if (shard.dim >= 0) {
      mine = mine.slice(shard.dim, shard.local_offset, shard.local_offset + shard.size);
      want = want.slice(shard.dim, shard.offset, shard.offset + shard.size);
    }
    const auto a = mine.to(dtype::float64).contiguous().to_vector<double>();
    const auto b = want.to(dtype::float64).contiguous().to_vector<double>();
    if (a.size() != b.size())
      return make_error(errc::invalid_argument, "{}: piece [{}, {}) of dimension {} holds {} values, want {}", fqn,
                        shard.offset, shard.offset + shard.size, shard.dim, a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!(std::abs(a[i] - b[i]) <= tolerance * (1 + std::abs(b[i]))))
        return make_error(errc::invalid_argument, "{}: piece [{}, {}) of dimension {} differs at its element {}: {} "
                          "against {}", fqn, shard.offset, shard.offset + shard.size, shard.dim, i, a[i], b[i]);
  }
  return {};
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
