#pragma once
// Embedding table: rows of a weight matrix looked up by integer ids.
#include <cstdint>

#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

struct embedding_options {
  std::int64_t num_embeddings = 0;
  std::int64_t embedding_dim = 0;
  /// Initial values are normal(0, init_std) (PyTorch: normal(0, 1)).
  double init_std = 1.0;
  dtype type = dtype::float32;
  std::uint64_t seed = 0;
};

/// weight [num, dim]. forward takes int64 ids of any shape wrapped in a
/// variable (`variable(ids)`) and returns ids.shape() + [dim].
class embedding : public module {
public:
  explicit embedding(const embedding_options& options);
  embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, std::uint64_t seed = 0);

  variable forward(const variable& ids) override;
  variable forward(const tensor& ids);

  const variable& weight() const noexcept { return weight_; }
  const embedding_options& options() const noexcept { return options_; }

protected:
  void init_parameter(const std::string& name, tensor& data, generator& gen) override;

private:
  embedding_options options_;
  variable weight_;
};

} // namespace troupe::nn
