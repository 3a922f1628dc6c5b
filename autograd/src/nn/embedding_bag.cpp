#include "troupe/autograd/nn/embedding_bag.hpp"

#include "init.hpp"
#include "troupe/autograd/functions.hpp"

namespace troupe::nn {

embedding_bag::embedding_bag(const embedding_bag_options& options) : options_(options) {
  require(options.num_embeddings > 0 && options.embedding_dim > 0,
          "embedding_bag: sizes must be positive, got {} x {}", options.num_embeddings,
          options.embedding_dim);
  weight_ = register_parameter(
    "weight", variable(tensor::zeros({options.num_embeddings, options.embedding_dim}, options.type)));
  reset_parameters(options.seed);
}

variable embedding_bag::forward(const variable& ids) {
  const auto& bags = ids.data();
  require(bags.rank() == 2, "embedding_bag: ids without offsets must be [bags, k], got {}", bags.shape());
  require(bags.type() == dtype::int64, "embedding_bag: ids must be int64, got {}", bags.type());
  auto k = bags.size(1);
  require(k > 0, "embedding_bag: bags of size 0 need explicit offsets, got {}", bags.shape());
  auto offsets = troupe::arange(0.0, static_cast<double>(bags.numel()), static_cast<double>(k)).to(bags.where());
  return forward(bags.reshape({-1}), offsets);
}

variable embedding_bag::forward(const tensor& indices, const tensor& offsets) {
  require(indices.type() == dtype::int64 && offsets.type() == dtype::int64,
          "embedding_bag: indices and offsets must be int64, got {} and {}", indices.type(), offsets.type());
  return autograd::embedding_bag(weight_, indices, offsets, options_.mode);
}

void embedding_bag::init_parameter(const std::string&, tensor& data, generator& gen) {
  detail::init_normal(data, options_.init_std, gen);
}

} // namespace troupe::nn
