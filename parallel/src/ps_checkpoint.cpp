#include "ps_checkpoint.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "troupe/tensor/error.hpp"

namespace troupe::parallel {

namespace {

constexpr std::string_view table_prefix = "parameter_server.";
constexpr std::string_view state_prefix = "optimizer.parameter_server.";
/// Bound on a saved layout's shard count (metadata is outside input).
constexpr std::uint32_t max_saved_shards = 1u << 20;

std::string weights_name(const table_spec& spec) { return fmt::format("{}{}", table_prefix, spec.name); }
std::string state_name(const table_spec& spec, std::string_view state) {
  return fmt::format("{}{}.{}", state_prefix, spec.name, state);
}
std::string layout_key(const table_spec& spec) { return fmt::format("{}{}.layout", table_prefix, spec.name); }
std::string step_key(std::uint16_t server) { return fmt::format("{}{}.step", table_prefix, server); }

const std::string* metadata_value(const checkpoint_reader& reader, const std::string& key) {
  for (const auto& [k, v] : reader.manifest().metadata)
    if (k == key)
      return &v;
  return nullptr;
}

template <class T> std::optional<T> parse_number(std::string_view text) {
  T out{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc{} || end != text.data() + text.size() || text.empty())
    return std::nullopt;
  return out;
}

/// The shard map that saved `spec`'s table (its layout metadata).
expected<shard_map> saved_map(const checkpoint_reader& reader, const table_spec& spec) {
  const auto key = layout_key(spec);
  const auto* value = metadata_value(reader, key);
  if (value == nullptr)
    return make_error(errc::state_mismatch, "checkpoint {} has no layout of parameter-server table '{}' ('{}')",
                      reader.directory().string(), spec.name, key);
  std::string_view text = *value;
  auto space = text.find(' ');
  auto kind = text.substr(0, space);
  // A plain count, not an optional: g++ 12 warns that the optional may be
  // read uninitialized when it is copied into the result.
  std::uint32_t shards = 0;
  if (space != std::string_view::npos)
    shards = parse_number<std::uint32_t>(text.substr(space + 1)).value_or(0);
  if ((kind != "row_ranges" && kind != "hashed") || shards == 0 || shards > max_saved_shards)
    return make_error(errc::malformed_message,
                      "checkpoint {}: the layout of parameter-server table '{}' is '{}', not '<row_ranges|hashed> "
                      "<shards in [1, {}]>'",
                      reader.directory().string(), spec.name, text, max_saved_shards);
  return shard_map{spec.rows, shards, kind == "hashed" ? sharding::hashed : sharding::row_ranges};
}

/// Whether the checkpoint holds `name` as `type` `shape` (the table's).
expected<void> check_tensor(const checkpoint_reader& reader, const table_spec& spec, const std::string& name,
                            dtype type, const dims& shape) {
  const auto* saved = reader.find(name);
  if (saved == nullptr)
    return make_error(errc::state_mismatch, "checkpoint {} has no tensor '{}' (parameter-server table '{}')",
                      reader.directory().string(), name, spec.name);
  if (saved->type != type || saved->global_shape != shape)
    return make_error(errc::state_mismatch,
                      "checkpoint {}: '{}' is {} {} there but {} {} in parameter-server table '{}'",
                      reader.directory().string(), name, saved->type, saved->global_shape, type, shape, spec.name);
  return {};
}

/// The state tensors `spec`'s optimizer keeps: name suffix and whether per
/// row ([rows]) or per element ([rows, dim]).
std::vector<std::pair<std::string_view, bool>> row_states(const table_spec& spec) {
  switch (spec.optimizer.type) {
    case sparse_optimizer::kind::sgd:
      return {};
    case sparse_optimizer::kind::rowwise_adagrad:
      return {{"sum", true}};
    case sparse_optimizer::kind::lazy_adam:
      return {{"exp_avg", false}, {"exp_avg_sq", false}};
  }
  return {};
}

/// Rows `saved_rows` (ascending not required) of tensor `name` gathered
/// into a [rows.size(), ...] tensor. Reads the smallest range of saved
/// rows that holds them all (a row-range shard's own range; for hashed
/// layouts, most of the table).
expected<tensor> gather_rows(const checkpoint_reader& reader, const std::string& name, const dims& global_shape,
                             const std::vector<std::int64_t>& saved_rows) {
  dims shape = global_shape;
  shape[0] = static_cast<std::int64_t>(saved_rows.size());
  auto out = tensor::empty(shape);
  if (saved_rows.empty())
    return out;
  const auto [low, high] = std::minmax_element(saved_rows.begin(), saved_rows.end());
  tensor_region region{dims(global_shape.size(), 0), global_shape};
  region.offset[0] = *low;
  region.shape[0] = *high - *low + 1;
  auto range = reader.read(name, region);
  if (!range)
    return error(range.error().code(), fmt::format("checkpoint {}: {}", reader.directory().string(),
                                                   range.error().message()));
  auto source = range->contiguous();
  const auto row_elements = source.numel() / region.shape[0];
  const auto row_bytes = static_cast<std::size_t>(row_elements) * sizeof(float);
  const auto* from = static_cast<const std::byte*>(source.raw_data());
  auto* to = static_cast<std::byte*>(out.raw_data());
  for (std::size_t i = 0; i < saved_rows.size(); ++i)
    std::memcpy(to + i * row_bytes, from + static_cast<std::size_t>(saved_rows[i] - *low) * row_bytes, row_bytes);
  return out;
}

} // namespace

std::string parameter_server_writer(std::uint16_t server, std::uint32_t shard) {
  return fmt::format("parameter-server-{}.shard-{}", server, shard);
}

std::vector<std::string> parameter_server_writers(std::uint16_t server, const parameter_server_options& options) {
  std::vector<std::string> out;
  for (std::uint32_t k = 0; k < options.servers.size(); ++k)
    out.push_back(parameter_server_writer(server, k));
  return out;
}

std::vector<state_share> parameter_server_shares(const parameter_server_options& options, std::uint16_t server,
                                                 std::uint32_t shard, std::vector<table_shard_state> copies) {
  // [0] this shard's rows, [1] what every shard holds alike (Adam's count).
  std::vector<state_share> shares(2);
  shares[1].holders = parameter_server_writers(server, options);
  const auto shards = static_cast<std::uint32_t>(options.servers.size());
  for (std::size_t t = 0; t < options.tables.size(); ++t) {
    const auto& spec = options.tables[t];
    auto& copy = copies.at(t);
    const shard_map map{spec.rows, shards, spec.shard_by};
    const auto first = map.first_saved_row(shard);
    auto add = [&](std::string name, tensor value, dims global_shape) {
      dims offset(global_shape.size(), 0);
      offset[0] = first;
      shares[0].pieces.push_back({std::move(name), std::move(value), std::move(global_shape), std::move(offset)});
    };
    if (map.rows_of(shard) > 0) { // more shards than rows leaves some empty
      add(weights_name(spec), copy.weights, {spec.rows, spec.dim});
      for (const auto& [state, per_row] : row_states(spec)) {
        const auto& value = state == "exp_avg" ? copy.first_moment : copy.second_moment;
        add(state_name(spec, state), value, per_row ? dims{spec.rows} : dims{spec.rows, spec.dim});
      }
    }
    if (spec.optimizer.type == sparse_optimizer::kind::lazy_adam) {
      auto count = tensor::scalar(static_cast<double>(copy.steps), dtype::int64);
      shares[1].pieces.push_back({state_name(spec, "step"), count, {}, {}});
    }
  }
  return shares;
}

checkpoint_metadata parameter_server_metadata(const parameter_server_options& options, std::uint16_t server,
                                              std::uint64_t table_step) {
  checkpoint_metadata out;
  out.emplace_back(step_key(server), std::to_string(table_step));
  for (const auto& spec : options.tables)
    out.emplace_back(layout_key(spec), fmt::format("{} {}", spec.shard_by == sharding::hashed ? "hashed" : "row_ranges",
                                                   options.servers.size()));
  return out;
}

expected<std::uint64_t> saved_table_step(const checkpoint_reader& reader, std::uint16_t server) {
  const auto key = step_key(server);
  const auto* value = metadata_value(reader, key);
  if (value == nullptr)
    return make_error(errc::state_mismatch, "checkpoint {} has no parameter-server state ('{}')",
                      reader.directory().string(), key);
  auto step = parse_number<std::uint64_t>(*value);
  if (!step)
    return make_error(errc::malformed_message, "checkpoint {}: '{}' is '{}', not a step", reader.directory().string(),
                      key, *value);
  return *step;
}

expected<void> check_parameter_server(const checkpoint_reader& reader, const parameter_server_options& options,
                                      std::uint16_t server) {
  if (auto step = saved_table_step(reader, server); !step)
    return step.error();
  for (const auto& spec : options.tables) {
    if (reader.find(weights_name(spec)) == nullptr)
      return make_error(errc::state_mismatch, "checkpoint {} has no parameter-server table '{}' ('{}')",
                        reader.directory().string(), spec.name, weights_name(spec));
    if (auto ok = check_tensor(reader, spec, weights_name(spec), dtype::float32, {spec.rows, spec.dim}); !ok)
      return ok;
    if (auto layout = saved_map(reader, spec); !layout)
      return layout.error();
    for (const auto& [state, per_row] : row_states(spec))
      if (auto ok = check_tensor(reader, spec, state_name(spec, state), dtype::float32,
                                 per_row ? dims{spec.rows} : dims{spec.rows, spec.dim});
          !ok)
        return ok;
    if (spec.optimizer.type == sparse_optimizer::kind::lazy_adam)
      if (auto ok = check_tensor(reader, spec, state_name(spec, "step"), dtype::int64, {}); !ok)
        return ok;
  }
  return {};
}

expected<std::vector<table_shard_state>> read_parameter_server_shard(const checkpoint_reader& reader,
                                                                     const parameter_server_options& options,
                                                                     std::uint32_t shard) {
  std::vector<table_shard_state> out;
  const auto shards = static_cast<std::uint32_t>(options.servers.size());
  for (const auto& spec : options.tables) {
    auto saved = saved_map(reader, spec);
    if (!saved)
      return saved.error();
    const shard_map mine{spec.rows, shards, spec.shard_by};
    std::vector<std::int64_t> rows(static_cast<std::size_t>(mine.rows_of(shard)));
    for (std::size_t r = 0; r < rows.size(); ++r)
      rows[r] = saved->saved_row(mine.global_id(shard, static_cast<std::int64_t>(r)));
    table_shard_state state;
    auto weights = gather_rows(reader, weights_name(spec), {spec.rows, spec.dim}, rows);
    if (!weights)
      return weights.error();
    state.weights = std::move(*weights);
    for (const auto& [name, per_row] : row_states(spec)) {
      auto value = gather_rows(reader, state_name(spec, name), per_row ? dims{spec.rows} : dims{spec.rows, spec.dim},
                               rows);
      if (!value)
        return value.error();
      (name == "exp_avg" ? state.first_moment : state.second_moment) = std::move(*value);
    }
    if (spec.optimizer.type == sparse_optimizer::kind::lazy_adam) {
      auto count = reader.read(state_name(spec, "step"));
      if (!count)
        return count.error();
      state.steps = count->to_vector<std::int64_t>().at(0);
    }
    out.push_back(std::move(state));
  }
  return out;
}

} // namespace troupe::parallel
