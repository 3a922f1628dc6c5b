#pragma once
// Parameter-server tables in distributed checkpoints (internal:
// parallel::checkpoints and the server shards use it).
//
// Names. Table `emb` is saved as `parameter_server.emb` [rows, dim] float32,
// its optimizer state as `optimizer.parameter_server.emb.<state>`:
// `sum` [rows] (row-wise Adagrad's accumulator), `exp_avg` and `exp_avg_sq`
// [rows, dim] and `step` (lazy Adam's moments and bias-correction count).
// Each shard writes its own rows as one piece of each tensor (row-range
// shards their range; hashed shards shard-major, shard_map::saved_row), and
// the coordinator records each table's saved layout and the tables' step
// in the manifest's metadata:
//   parameter_server.<table>.layout   "row_ranges <shards>" | "hashed <shards>"
//   parameter_server.<server>.step    the step of the tables' state
// A load maps every row of a shard (any count, any sharding) to its saved
// row, so 2 shards load into 3 or 1, row ranges into hashed and back.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ps_shard.hpp"
#include "ps_wire.hpp"
#include "training_state.hpp"
#include "troupe/parallel/parameter_server.hpp"
#include "troupe/serialization/checkpoint_file.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

/// The writer name of shard `shard` of tracked server `server`.
std::string parameter_server_writer(std::uint16_t server, std::uint32_t shard);
/// Every shard's writer name.
std::vector<std::string> parameter_server_writers(std::uint16_t server, const parameter_server_options& options);

/// The pieces of shard `shard`'s tables, from copies of their state.
std::vector<state_share> parameter_server_shares(const parameter_server_options& options, std::uint16_t server,
                                                 std::uint32_t shard, std::vector<table_shard_state> copies);

/// What the coordinator adds to the manifest's metadata.
checkpoint_metadata parameter_server_metadata(const parameter_server_options& options, std::uint16_t server,
                                              std::uint64_t table_step);

/// The step of tracked server `server`'s tables in the checkpoint;
/// errc::state_mismatch when it holds none.
expected<std::uint64_t> saved_table_step(const checkpoint_reader& reader, std::uint16_t server);

/// Whether the checkpoint holds every table of `options` with its shape
/// and its optimizer's state (reads no shard): errc::state_mismatch naming
/// the first table or tensor that is missing or differs.
expected<void> check_parameter_server(const checkpoint_reader& reader, const parameter_server_options& options,
                                      std::uint16_t server);

/// Shard `shard`'s rows and optimizer state of every table, read from the
/// checkpoint whatever shard count and sharding saved it.
expected<std::vector<table_shard_state>> read_parameter_server_shard(const checkpoint_reader& reader,
                                                                     const parameter_server_options& options,
                                                                     std::uint32_t shard);

/// The trainer's side of the shards' checkpoint requests (parameter_server.cpp).
struct parameter_server_access {
  /// The step of the trainer's last step() (0: none).
  static std::uint64_t last_step(const parameter_client& client);
  static const parameter_server_options& options(const parameter_client& client);
  /// Sends `kind` to every shard and waits (at most `timeout`) for every
  /// reply; the first error names the shard.
  static expected<void> ask_every_shard(parameter_client& client, ps_wire::op kind,
                                        const ps_wire::checkpoint_request& request, std::chrono::milliseconds timeout);
  /// After a resume: the next step is `table_step + 1`; recorded rows go.
  static void continue_after(parameter_client& client, std::uint64_t table_step);
};

} // namespace troupe::parallel
