#include "troupe/autograd/nn/embedding.hpp"

#include "init.hpp"
#include "troupe/autograd/functions.hpp"

namespace troupe::nn {

embedding::embedding(const embedding_options& options) : options_(options) {
  require(options.num_embeddings > 0 && options.embedding_dim > 0,
          "embedding: sizes must be positive, got {} x {}", options.num_embeddings, options.embedding_dim);
  weight_ = register_parameter(
    "weight", variable(tensor::zeros({options.num_embeddings, options.embedding_dim}, options.type)));
  reset_parameters(options.seed);
}

embedding::embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, std::uint64_t seed)
  : embedding(embedding_options{.num_embeddings = num_embeddings, .embedding_dim = embedding_dim, .seed = seed}) {}

variable embedding::forward(const variable& ids) {
  return forward(ids.data());
}

variable embedding::forward(const tensor& ids) {
  require(ids.type() == dtype::int64, "embedding: ids must be int64, got {}", ids.type());
  return autograd::embedding(weight_, ids);
}

void embedding::init_parameter(const std::string&, tensor& data, generator& gen) {
  detail::init_normal(data, options_.init_std, gen);
}

} // namespace troupe::nn
