#pragma once
// Bags of embeddings reduced by sum or mean (torch.nn.EmbeddingBag).
#include <cstdint>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {

struct embedding_bag_options {
  std::int64_t num_embeddings = 0;
  std::int64_t embedding_dim = 0;
  bag_mode mode = bag_mode::mean;
  double init_std = 1.0;
  dtype type = dtype::float32;
  std::uint64_t seed = 0;
};

/// weight [num, dim], initialised normal(0, init_std).
class embedding_bag : public module {
public:
  explicit embedding_bag(const embedding_bag_options& options);

  /// ids [bags, k] int64 (wrapped in a variable): bags of equal size k.
  /// Returns [bags, dim].
  variable forward(const variable& ids) override;
  /// indices [n] int64, offsets [bags] int64: bag i is
  /// indices[offsets[i] : offsets[i+1]] (the last runs to n; empty → zeros).
  variable forward(const tensor& indices, const tensor& offsets);

  const variable& weight() const noexcept { return weight_; }
  const embedding_bag_options& options() const noexcept { return options_; }

protected:
  void init_parameter(const std::string& name, tensor& data, generator& gen) override;

private:
  embedding_bag_options options_;
  variable weight_;
};

} // namespace troupe::nn
