#include "ps_shard.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "troupe/tensor/error.hpp"
#include "troupe/tensor/ops.hpp"
#include "troupe/tensor/random.hpp"

namespace troupe::parallel {

std::int64_t shard_map::rows_of(std::uint32_t k) const {
  if (by == sharding::hashed)
    return rows / shards + (static_cast<std::int64_t>(k) < rows % shards ? 1 : 0);
  auto first = std::min<std::int64_t>(rows, k * rows_per_range());
  return std::min<std::int64_t>(rows, first + rows_per_range()) - first;
}

std::int64_t shard_map::first_saved_row(std::uint32_t k) const {
  if (by == sharding::hashed && shards > 1)
    return k * (rows / shards) + std::min<std::int64_t>(k, rows % shards);
  return std::min<std::int64_t>(rows, k * rows_per_range());
}

table_shard::table_shard(const table_spec& spec, std::uint32_t shard, std::uint32_t shards)
    : spec_(spec), map_{spec.rows, shards, spec.shard_by}, shard_(shard), rows_(map_.rows_of(shard)) {
  const auto dim = spec_.dim;
  weights_.resize(static_cast<std::size_t>(rows_ * dim));
  // Element (r, c) of the whole table is Philox counter r * dim + c, so the
  // values do not depend on how the table is sharded.
  if (spec_.shard_by == sharding::row_ranges || shards == 1) {
    generator gen{spec_.seed, static_cast<std::uint64_t>(map_.global_id(shard, 0) * dim)};
    constexpr std::int64_t chunk_rows = 1 << 14;
    for (std::int64_t r = 0; r < rows_; r += chunk_rows) {
      auto n = std::min(chunk_rows, rows_ - r);
      auto values = randn({n, dim}, gen, 0.0, spec_.init_std);
      std::memcpy(weights_.data() + r * dim, values.raw_data(), static_cast<std::size_t>(n * dim) * sizeof(float));
    }
  } else {
    for (std::int64_t r = 0; r < rows_; ++r) {
      generator gen{spec_.seed, static_cast<std::uint64_t>(map_.global_id(shard, r) * dim)};
      auto values = randn({dim}, gen, 0.0, spec_.init_std);
      std::memcpy(weights_.data() + r * dim, values.raw_data(), static_cast<std::size_t>(dim) * sizeof(float));
    }
  }
  switch (spec_.optimizer.type) {
    case sparse_optimizer::kind::sgd:
      break;
    case sparse_optimizer::kind::rowwise_adagrad:
      second_moment_.assign(static_cast<std::size_t>(rows_), 0.0f);
      break;
    case sparse_optimizer::kind::lazy_adam:
      first_moment_.assign(weights_.size(), 0.0f);
      second_moment_.assign(weights_.size(), 0.0f);
      break;
  }
}

expected<void> table_shard::check_ids(std::span<const std::int64_t> ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto id = ids[i];
    if (id < 0 || id >= spec_.rows)
      return make_error(errc::invalid_argument, "table '{}': id {} (position {}) is outside [0, {})", spec_.name, id, i,
                        spec_.rows);
    if (map_.shard_of(id) != shard_)
      return make_error(errc::invalid_argument, "table '{}': id {} (position {}) belongs to shard {}, not {}",
                        spec_.name, id, i, map_.shard_of(id), shard_);
  }
  return {};
}

void table_shard::pool(std::span<const std::int64_t> offsets, std::span<const std::int64_t> ids,
                       std::span<const float> weights, float* out) const {
  const auto dim = spec_.dim;
  const auto n = static_cast<std::int64_t>(ids.size());
  for (std::size_t b = 0; b < offsets.size(); ++b) {
    auto begin = offsets[b];
    auto end = b + 1 < offsets.size() ? offsets[b + 1] : n;
    float* o = out + static_cast<std::int64_t>(b) * dim;
    for (auto i = begin; i < end; ++i) {
      if (i + 8 < n) {
        const char* ahead = reinterpret_cast<const char*>(weights_.data() + map_.local_row(ids[static_cast<std::size_t>(i + 8)]) * dim);
        for (std::int64_t at = 0; at < dim * 4; at += 64)
          __builtin_prefetch(ahead + at);
      }
      const float* row = weights_.data() + map_.local_row(ids[static_cast<std::size_t>(i)]) * dim;
      const float w = weights.empty() ? 1.0f : weights[static_cast<std::size_t>(i)];
      for (std::int64_t c = 0; c < dim; ++c)
        o[c] += w * row[c];
    }
  }
}

void table_shard::apply(std::span<const std::int64_t> ids, const float* grads, float scale) {
  const auto dim = spec_.dim;
  const auto& opt = spec_.optimizer;
  const auto lr = static_cast<float>(opt.lr);
  const auto eps = static_cast<float>(opt.eps);
  if (opt.type == sparse_optimizer::kind::lazy_adam)
    ++steps_;
  // torch.optim.SparseAdam: step size lr * sqrt(1 - b2^t) / (1 - b1^t).
  const double bias1 = 1.0 - std::pow(opt.beta1, static_cast<double>(steps_));
  const double bias2 = 1.0 - std::pow(opt.beta2, static_cast<double>(steps_));
  const auto adam_step = steps_ > 0 ? static_cast<float>(opt.lr * std::sqrt(bias2) / bias1) : 0.0f;
  const auto b1 = static_cast<float>(opt.beta1), b2 = static_cast<float>(opt.beta2);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto r = map_.local_row(ids[i]);
    float* w = weights_.data() + r * dim;
    const float* g = grads + static_cast<std::int64_t>(i) * dim;
    switch (opt.type) {
      case sparse_optimizer::kind::sgd:
        for (std::int64_t c = 0; c < dim; ++c)
          w[c] -= lr * (scale * g[c]);
        break;
      case sparse_optimizer::kind::rowwise_adagrad: {
        float squares = 0.0f;
        for (std::int64_t c = 0; c < dim; ++c) {
          const float gc = scale * g[c];
          squares += gc * gc;
        }
        float& accumulator = second_moment_[static_cast<std::size_t>(r)];
        accumulator += squares / static_cast<float>(dim);
        const float step = lr / (std::sqrt(accumulator) + eps);
        for (std::int64_t c = 0; c < dim; ++c)
          w[c] -= step * (scale * g[c]);
        break;
      }
      case sparse_optimizer::kind::lazy_adam: {
        float* m = first_moment_.data() + r * dim;
        float* v = second_moment_.data() + r * dim;
        for (std::int64_t c = 0; c < dim; ++c) {
          const float gc = scale * g[c];
          m[c] = b1 * m[c] + (1.0f - b1) * gc;
          v[c] = b2 * v[c] + (1.0f - b2) * gc * gc;
          w[c] -= adam_step * m[c] / (std::sqrt(v[c]) + eps);
        }
        break;
      }
    }
  }
}

namespace {

tensor copy_of(const std::vector<float>& values, dims shape) {
  auto out = tensor::empty(std::move(shape));
  if (!values.empty())
    std::memcpy(out.raw_data(), values.data(), values.size() * sizeof(float));
  return out;
}

void restore_into(std::vector<float>& values, const tensor& from, std::string_view what, const table_spec& spec) {
  require(from.defined() && from.type() == dtype::float32 && from.is_contiguous() &&
              static_cast<std::size_t>(from.numel()) == values.size(),
          "table '{}': restoring its {} from {} values, not {}", spec.name, what,
          from.defined() ? from.numel() : 0, values.size());
  if (!values.empty())
    std::memcpy(values.data(), from.raw_data(), values.size() * sizeof(float));
}

} // namespace

table_shard_state table_shard::copy_state() const {
  table_shard_state out;
  out.weights = copy_of(weights_, {rows_, spec_.dim});
  if (!first_moment_.empty())
    out.first_moment = copy_of(first_moment_, {rows_, spec_.dim});
  if (spec_.optimizer.type == sparse_optimizer::kind::lazy_adam)
    out.second_moment = copy_of(second_moment_, {rows_, spec_.dim});
  else if (spec_.optimizer.type == sparse_optimizer::kind::rowwise_adagrad)
    out.second_moment = copy_of(second_moment_, {rows_});
  out.steps = steps_;
  return out;
}

void table_shard::restore(const table_shard_state& state) {
  restore_into(weights_, state.weights, "rows", spec_);
  if (!first_moment_.empty())
    restore_into(first_moment_, state.first_moment, "first moments", spec_);
  if (!second_moment_.empty())
    restore_into(second_moment_, state.second_moment, "second moments", spec_);
  steps_ = state.steps;
}

expected<tensor> table_shard::read(std::int64_t first, std::int64_t count) const {
  if (first < 0 || count < 0 || first + count > spec_.rows)
    return make_error(errc::invalid_argument, "table '{}': rows [{}, {}) are outside [0, {})", spec_.name, first,
                      first + count, spec_.rows);
  auto out = tensor::empty({count, spec_.dim});
  for (std::int64_t i = 0; i < count; ++i) {
    if (map_.shard_of(first + i) != shard_)
      return make_error(errc::invalid_argument, "table '{}': row {} is on shard {}, not {}", spec_.name, first + i,
                        map_.shard_of(first + i), shard_);
    std::memcpy(out.data<float>() + i * spec_.dim, weights_.data() + map_.local_row(first + i) * spec_.dim,
                static_cast<std::size_t>(spec_.dim) * sizeof(float));
  }
  return out;
}

} // namespace troupe::parallel
