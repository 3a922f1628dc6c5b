#pragma once
// A model's and its optimizer's state as pieces of a distributed checkpoint
// (internal: parallel::checkpoints and the pipeline stages use it).
//
// Names. A parameter or buffer `fc1.weight` is saved as `model.fc1.weight`
// and its optimizer state as `optimizer.fc1.weight.exp_avg`; the optimizer's
// step count is `optimizer.step`. Pipeline slices and data-parallel replicas
// keep the whole model's names, so a checkpoint saved at one layout loads
// at any other by name: a stage reads the names of its own layers.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <thread>
#include <vector>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/serialization/checkpoint_reader.hpp"
#include "troupe/serialization/shard_writer.hpp"
#include "troupe/tensor/expected.hpp"

namespace troupe::parallel {

/// One write at a time on a thread of its own: an asynchronous save runs
/// there while training goes on, and the next save waits for it.
class background_writer {
public:
  background_writer();
  /// Waits for the write in flight.
  ~background_writer();
  background_writer(const background_writer&) = delete;
  background_writer& operator=(const background_writer&) = delete;

  /// Waits for the previous write, then starts `write`. Returns the
  /// previous write's error, if it failed (and does not start `write`).
  expected<void> submit(std::function<expected<void>()> write);
  /// A save's write: started on the thread (as `submit`) when the save is
  /// asynchronous, else run here after the previous write, whose error
  /// comes first.
  expected<void> write(std::function<expected<void>()> write, bool asynchronous);
  /// Waits for the previous write, then runs `copy` on the thread and then
  /// the write it returns; returns at once. Until `copy` has returned,
  /// wait_for_copy() blocks: what is about to change the state being copied
  /// (a stage's next optimizer step) calls it first.
  expected<void> submit_copy(std::function<std::function<expected<void>()>()> copy);
  void wait_for_copy();
  /// Waits for the write in flight; its error.
  expected<void> wait();

private:
  void run();
  /// Waits until no write runs; the last write's failure, once.
  expected<void> wait_idle(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<std::function<expected<void>()>()> pending_;
  bool busy_ = false;
  bool copying_ = false;
  bool stopping_ = false;
  std::optional<error> failed_;
  std::thread thread_;
};

/// Pieces that a set of writers hold alike (empty holders: one writer alone).
struct state_share {
  std::vector<tensor_piece> pieces;
  std::vector<std::string> holders;
};

/// Where a model's state lies among a checkpoint's names. The job's model
/// (one process, a stage, a replica): `model.`, `optimizer.` and the step
/// count `optimizer.step`. A remote module `head` is a part of the job's
/// model that keeps an optimizer of its own: `model.head.`,
/// `optimizer.head.` and `optimizer.head.step`.
struct state_names {
  std::string model = "model.";
  std::string optimizer = "optimizer.";
  std::string step = "optimizer.step";
  static state_names of_part(std::string_view part);
};

/// What a shard file (or a caller asking for a copy) gets of `value`: host
/// memory. A device's state is copied to the host, which is also a
/// snapshot; host memory is cloned when `snapshot`, else the live tensor.
tensor host_copy(const tensor& value, bool snapshot);

/// The model's state_dict as whole-tensor pieces; `snapshot` copies them
/// (an asynchronous save writes while training changes the originals).
std::vector<tensor_piece> model_pieces(const nn::module& model, bool snapshot, const state_names& names = {});
/// The optimizer's state but its step count, as whole-tensor pieces;
/// `snapshot` copies them.
std::vector<tensor_piece> optimizer_pieces(const optim::optimizer& optimizer, bool snapshot,
                                           const state_names& names = {});
/// `optimizer.step` alone (held alike by every stage and replica).
tensor_piece optimizer_step_piece(const optim::optimizer& optimizer, const state_names& names = {});

/// Writes `shares` as `writer`'s shard and report of step `step` under
/// `root`; on failure, reports it (shard_writer::report_failure) so the
/// coordinator stops waiting, and returns it.
expected<void> write_shares(const std::filesystem::path& root, std::uint64_t step, const std::string& writer,
                            std::span<const state_share> shares);

/// Whether `reader`'s checkpoint has every tensor of `model`'s state_dict
/// with its dtype and shape (reads no shard): errc::state_mismatch naming
/// the first that it lacks or that differs.
expected<void> check_model(const checkpoint_reader& reader, const nn::module& model, const state_names& names = {});
/// A model's and its optimizer's state read from a checkpoint, not yet
/// loaded: everything is read (and every piece's checksum checked) before
/// anything changes, so a model is never half-loaded.
struct training_state_values {
  named_tensors model;
  named_tensors optimizer;
};
/// Reads every tensor of `model`'s state_dict (errc::state_mismatch naming
/// the first name missing from the checkpoint, or the first shape or dtype
/// that differs) and the optimizer state of `optimizer`'s parameters with
/// `optimizer.step`.
expected<training_state_values> read_training_state(const checkpoint_reader& reader, const nn::module& model,
                                                    const optim::optimizer& optimizer, const state_names& names = {});
/// Loads what read_training_state read (the optimizer first: its checks
/// come before any change, and the model's were made by the read). The
/// optimizer keeps the values read as its state (no copy).
expected<void> apply_training_state(training_state_values values, nn::module& model, optim::optimizer& optimizer);

/// Where one writer's part of a save goes and who else holds it.
struct save_target {
  std::filesystem::path root;
  std::uint64_t step = 0;
  std::string writer;
  /// Writers holding the same model and optimizer state (data-parallel
  /// replicas, a stage's replicas), this one among them; empty: this one alone.
  std::vector<std::string> state_holders;
  /// Writers holding an optimizer with the same step count (every stage,
  /// every replica), this one among them; empty: this one alone.
  std::vector<std::string> step_holders;
  /// Tensor-parallel pieces (a stage of a tensor_parallel_pipeline): the
  /// split parameters' pieces are held alike by `split_holders` (the same
  /// stage and tensor rank of every replica), what the stage's members hold
  /// whole by `state_holders`.
  bool sharded = false;
  std::vector<std::string> split_holders{};
};

/// `model`'s and `optimizer`'s pieces: the state held alike by
/// `state_holders`, the step count by `step_holders` (see save_target);
/// `snapshot` copies the model's tensors.
std::vector<state_share> training_shares(const nn::module& model, const optim::optimizer& optimizer,
                                         std::vector<std::string> state_holders,
                                         std::vector<std::string> step_holders, bool snapshot,
                                         const state_names& names = {});

/// A tensor-parallel model's pieces (parameter_shards: tensor_parallel.hpp):
/// a split parameter's piece and its optimizer state held alike by
/// `split_holders` (this member's data-parallel replicas; empty: this writer
/// alone), what every member holds whole (replicated parameters, buffers,
/// per-parameter counts) alike by `whole_holders`, the optimizer's step
/// count by `step_holders` (every stage of a pipeline, too).
std::vector<state_share> sharded_training_shares(nn::module& model, const optim::optimizer& optimizer,
                                                 std::vector<std::string> split_holders,
                                                 std::vector<std::string> whole_holders,
                                                 std::vector<std::string> step_holders, bool snapshot);
/// Reads this rank's pieces of a tensor-parallel model and of its
/// optimizer's state from a checkpoint of any layout (whole, or split at
/// another degree): each piece is the region of the saved whole it covers.
expected<training_state_values> read_sharded_training_state(const checkpoint_reader& reader, nn::module& model);

/// Saves `model` and `optimizer` as `target.writer`'s shard. Asynchronous:
/// returns at once (the previous write's error, if it failed) while
/// `thread` copies the state and then writes it; the caller must not change
/// the state before `thread.wait_for_copy()`. Otherwise writes before
/// returning.
expected<void> save_training_state(nn::module& model, const optim::optimizer& optimizer,
                                   background_writer& thread, save_target target, bool asynchronous);
/// Waits for `thread`'s write in flight, then loads `model` and
/// `optimizer` from the checkpoint in `directory` (`sharded`: its
/// tensor-parallel pieces, read_sharded_training_state).
expected<void> load_training_state(nn::module& model, optim::optimizer& optimizer, background_writer& thread,
                                   const std::filesystem::path& directory, bool sharded = false);

/// Names joined by ',' (a stage message's holders), split; "" -> none.
std::vector<std::string> split_names(std::string_view joined);

/// `name` made a writer name ([A-Za-z0-9._-]): "worker0/cpu/stage1" ->
/// "worker0-cpu-stage1".
std::string writer_name(std::string_view name);


} // namespace troupe::parallel
