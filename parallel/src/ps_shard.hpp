#pragma once
// One shard of one parameter-server table: its rows, its optimizer state,
// pooled lookups and sparse updates. Plain data and loops, no threads (the
// server actor owns it and calls it from its own thread).
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/parallel/parameter_server.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel {

/// Where the rows of a table live among `shards` shards.
struct shard_map {
  std::int64_t rows = 0;
  std::uint32_t shards = 1;
  sharding by = sharding::row_ranges;

  std::int64_t rows_per_range() const { return (rows + shards - 1) / shards; }
  std::uint32_t shard_of(std::int64_t id) const {
    return by == sharding::hashed ? static_cast<std::uint32_t>(id % shards)
                                  : static_cast<std::uint32_t>(id / rows_per_range());
  }
  /// The row of `id` within its shard.
  std::int64_t local_row(std::int64_t id) const {
    return by == sharding::hashed ? id / shards : id - shard_of(id) * rows_per_range();
  }
  /// The id of shard `k`'s local row `r`.
  std::int64_t global_id(std::uint32_t k, std::int64_t r) const {
    return by == sharding::hashed ? r * shards + k : k * rows_per_range() + r;
  }
  std::int64_t rows_of(std::uint32_t k) const;
  /// Where row `id` lies in a checkpoint's [rows, dim] tensor of the table
  /// saved by these shards: row ranges keep id order; hashed rows are saved
  /// shard-major (shard 0's rows, then shard 1's, ...), so that every shard's
  /// rows are one box of the tensor and each shard writes one piece.
  std::int64_t saved_row(std::int64_t id) const {
    return by == sharding::hashed && shards > 1 ? first_saved_row(shard_of(id)) + local_row(id) : id;
  }
  /// The saved row of shard `k`'s local row 0.
  std::int64_t first_saved_row(std::uint32_t k) const;
};

/// A table shard's rows and optimizer state in its local row order: what a
/// checkpoint copies, and what a load puts in place.
struct table_shard_state {
  tensor weights;       ///< [rows, dim] float32
  tensor first_moment;  ///< lazy_adam: [rows, dim]; undefined otherwise
  tensor second_moment; ///< lazy_adam: [rows, dim]; rowwise_adagrad: [rows]; sgd: undefined
  std::int64_t steps = 0; ///< lazy_adam's bias-correction count
};

class table_shard {
public:
  table_shard(const table_spec& spec, std::uint32_t shard, std::uint32_t shards);

  const table_spec& spec() const { return spec_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t dim() const { return spec_.dim; }

  /// errc::invalid_argument naming the first id that is negative, past the
  /// table or on another shard.
  expected<void> check_ids(std::span<const std::int64_t> ids) const;

  /// out[b] += sum over bag b of weight * row(id) (weights empty: 1); `out`
  /// is [offsets.size(), dim], zeroed by the caller. Ids already checked.
  void pool(std::span<const std::int64_t> offsets, std::span<const std::int64_t> ids, std::span<const float> weights,
            float* out) const;

  /// One optimizer application: `ids` unique and checked, `grads` their
  /// rows (ids.size() * dim), each multiplied by `scale` first.
  void apply(std::span<const std::int64_t> ids, const float* grads, float scale);

  /// A copy of the rows of global ids [first, first + count), all on this shard.
  expected<tensor> read(std::int64_t first, std::int64_t count) const;

  /// A copy of the rows and optimizer state.
  table_shard_state copy_state() const;
  /// Puts `state` in place; its shapes must be copy_state()'s (usage_error).
  void restore(const table_shard_state& state);
  const shard_map& map() const { return map_; }
  std::uint32_t index() const { return shard_; }

  std::uint64_t table_bytes() const { return weights_.size() * sizeof(float); }
  std::uint64_t state_bytes() const { return (first_moment_.size() + second_moment_.size()) * sizeof(float); }

private:
  table_spec spec_;
  shard_map map_;
  std::uint32_t shard_;
  std::int64_t rows_;
  std::vector<float> weights_;       // [rows_, dim]
  std::vector<float> first_moment_;  // lazy_adam: [rows_, dim]
  std::vector<float> second_moment_; // lazy_adam: [rows_, dim]; rowwise_adagrad: [rows_]
  std::int64_t steps_ = 0;           // lazy_adam's bias correction
};

} // namespace troupe::parallel
