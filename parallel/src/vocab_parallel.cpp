// The vocabulary split over a group (vocab_parallel.hpp).
#include "troupe/parallel/vocab_parallel.hpp"

#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "troupe/autograd/functions.hpp"
#include "troupe/parallel/all_gather.hpp"
#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"

#include "reducer_member.hpp"
#include "value_or_throw.hpp"

namespace troupe::parallel {

namespace {

/// Which of `ids` (int64, any shape, on any device) fall in `mine`: their
/// local index (0 where not) and a mask of 1 / 0 in `type`, shaped
/// ids.shape() + [1], both on `where` (the device of the rows they index).
struct local_ids {
  tensor index;
  tensor mask;
};

local_ids in_range(const tensor& ids, shard_range mine, std::int64_t vocabulary, dtype type, device where,
                   const char* what) {
  require(ids.type() == dtype::int64, "{}: ids must be int64, got {}", what, ids.type());
  const auto flat = ids.to(device::cpu()).contiguous(); // checked and split on the host
  auto shape = flat.shape();
  local_ids out{tensor::zeros(shape, dtype::int64), {}};
  shape.push_back(1);
  out.mask = tensor::zeros(shape, dtype::float64);
  const auto* id = flat.data<std::int64_t>();
  auto* local = out.index.data<std::int64_t>();
  auto* mask = out.mask.data<double>();
  for (std::int64_t i = 0; i < flat.numel(); ++i) {
    require(id[i] >= 0 && id[i] < vocabulary, "{}: id {} at {} is outside the vocabulary [0, {})", what, id[i], i,
            vocabulary);
    if (id[i] >= mine.offset && id[i] < mine.offset + mine.size) {
      local[i] = id[i] - mine.offset;
      mask[i] = 1.0;
    }
  }
  out.index = out.index.to(where);
  out.mask = out.mask.to(type).to(where);
  return out;
}

shard_range rows_of(std::int64_t vocabulary, reducer_group& group, const char* what) {
  require(vocabulary >= group.size(), "{}: a vocabulary of {} over {} ranks leaves a rank without rows", what,
          vocabulary, group.size());
  return tensor_parallel_split(vocabulary, group.size(), group.rank());
}

} // namespace

vocab_parallel_embedding::vocab_parallel_embedding(const nn::embedding_options& whole, reducer_group& group)
    : whole_(whole), group_(reducer_group_access::share(group)),
      rows_(rows_of(whole.num_embeddings, group, "vocab_parallel_embedding")) {
  require(whole.embedding_dim > 0, "vocab_parallel_embedding: embedding_dim must be positive, got {}",
          whole.embedding_dim);
  weight_ = register_parameter("weight", autograd::variable(tensor::zeros({rows_.size, whole.embedding_dim},
                                                                          whole.type)));
  reset_parameters(whole.seed);
}

void vocab_parallel_embedding::init_parameter(const std::string&, tensor& data, generator& gen) {
  // nn::embedding's rule for the whole table, this rank's rows kept.
  auto table = randn({whole_.num_embeddings, whole_.embedding_dim}, gen, 0.0, whole_.init_std, whole_.type);
  data.copy_from(table.slice(0, rows_.offset, rows_.offset + rows_.size));
}

autograd::variable vocab_parallel_embedding::forward(const autograd::variable& ids) {
  auto local = in_range(ids.data(), rows_, whole_.num_embeddings, whole_.type, weight_.data().where(),
                        "vocab_parallel_embedding");
  auto mine = autograd::mul(autograd::embedding(weight_, local.index), autograd::variable(local.mask));
  return reduce_from_group(mine, group_);
}

std::vector<parameter_shard> vocab_parallel_embedding::shards() const {
  return {{"weight", {whole_.num_embeddings, whole_.embedding_dim}, 0, rows_.offset, rows_.size, 0}};
}

autograd::variable vocab_parallel_cross_entropy(const autograd::variable& logits, const tensor& targets,
                                                reducer_group& group, std::int64_t vocabulary) {
  constexpr const char* what = "vocab_parallel_cross_entropy";
  const auto mine = rows_of(vocabulary, group, what);
  const auto& data = logits.data();
  require(data.rank() == 2 && data.shape()[1] == mine.size, "{}: rank {} holds classes [{}, {}) of {}, so its "
          "logits must be [n, {}], got {}", what, group.rank(), mine.offset, mine.offset + mine.size, vocabulary,
          mine.size, data.shape());
  const auto n = data.shape()[0];
  require(targets.rank() == 1 && targets.shape()[0] == n, "{}: targets must be [{}], got {}", what, n,
          targets.shape());
  // The rows' maximum over the whole vocabulary shifts the exponentials
  // into range; the loss does not depend on it, so autograd does not either.
  // (The group gathers host memory; the maxima go back to the logits' device.)
  auto maxima = value_or_throw(all_gather(group, max(data, 1).values.to(device::cpu()).contiguous()), what);
  auto row_max = max(maxima.view({static_cast<std::int64_t>(group.size()), n}), 0).values.to(data.where());
  auto shifted = autograd::sub(logits, autograd::variable(row_max.unsqueeze(1)));
  auto sum_exp = reduce_from_group(autograd::sum(autograd::exp(shifted), {1}), group);
  auto local = in_range(targets, mine, vocabulary, data.type(), data.where(), what);
  auto picked = autograd::mul(autograd::gather(shifted, 1, local.index.unsqueeze(1)), autograd::variable(local.mask));
  auto target_logit = reduce_from_group(autograd::reshape(picked, {n}), group);
  return autograd::mean(autograd::sub(autograd::log(sum_exp), target_logit));
}

} // namespace troupe::parallel
