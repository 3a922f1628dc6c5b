#pragma once
// The first phase of a distributed checkpoint: every actor that holds state
// writes its own pieces to one shard file in the checkpoint's staging
// directory (`<root>/step-<N>.tmp/<writer>.shard`, an ordinary checkpoint
// file), fsyncs it, and hands the pieces' descriptions to the coordinator,
// which commits them (checkpoint_directory.hpp).
//
// A piece is a box of a whole tensor: a tensor-parallel shard (split along a
// dimension at an offset), a pipeline stage's or parameter server's whole
// tensors, or state every data-parallel replica holds alike. State that
// several writers hold alike is written once: each piece goes to one of its
// holders, picked by a hash of its name and offset (replica_writer()), so
// the writing of replicated state is spread over the replicas rather than
// all falling on rank 0.
//
// The coordinator learns what each writer wrote from the writer's report
// file next to its shard, so writers and coordinator need share nothing
// but the checkpoint's directory (a shared file system across hosts).
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "troupe/serialization/checkpoint_manifest.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {

/// A box of a whole tensor that one writer holds.
struct tensor_piece {
  std::string name;  ///< the tensor's fully qualified name
  tensor value;      ///< the box's values (a CPU tensor; views are fine)
  dims global_shape; ///< the whole tensor's shape
  dims offset;       ///< where `value` starts in it, per dimension
};

/// The piece a rank holds of a tensor split along `dim` at `offset` (the
/// convention of parallel::parameter_shard); `dim` -1: the whole tensor.
/// A parameter_shard `s` of a local parameter `p` is the piece
/// split_piece(name, p.narrow(s.dim, s.local_offset, s.size),
/// s.global_shape, s.dim, s.offset); a parameter holding several pieces
/// (attention's q, k and v rows) gives one piece each.
tensor_piece split_piece(std::string name, tensor value, dims global_shape, std::int64_t dim,
                         std::int64_t offset);

/// Which of `holders` writes a piece they all hold: CRC32C of the name and
/// offset modulo the number of holders, the same in every process.
std::size_t replica_writer(const tensor_piece& piece, std::size_t holders);

/// Collects one writer's pieces and writes them as one shard file.
class shard_writer {
public:
  /// `writer` names the shard file: [A-Za-z0-9._-], not starting with '.'
  /// ("rank-3", "stage-1.replica-0"); unique among the checkpoint's writers.
  shard_writer(std::filesystem::path root, std::uint64_t step, std::string writer);

  /// A piece this writer alone holds. Throws usage_error when the piece
  /// does not fit its global shape.
  void add(tensor_piece piece);
  /// A piece every writer in `holders` (this one among them) holds alike;
  /// only holders[replica_writer()] writes it.
  void add(tensor_piece piece, std::span<const std::string> holders);

  /// Writes the shard file (created in the staging directory, fsynced;
  /// none when this writer has no piece to write), then the writer's report
  /// `<writer>.pieces`: what the coordinator needs, per tensor the pieces
  /// written, as a manifest that need not tile its tensors. A coordinator
  /// in another process waits for the reports (collect_reports() in
  /// checkpoint_directory.hpp); one in this process may use the returned
  /// value instead.
  expected<std::vector<checkpoint_tensor>> write() const;
  /// Tells the coordinator that this writer failed: `<writer>.failed` in
  /// the staging directory holds the message, so collect_reports() stops
  /// waiting and returns it. Best effort (the write that failed may be the
  /// disk's fault): a report that cannot be written is left to the
  /// coordinator's timeout.
  void report_failure(const error& why) const;

  const std::string& name() const noexcept { return writer_; }

private:
  /// The shard file alone, in `directory`.
  expected<std::vector<checkpoint_tensor>> write_shard(const std::filesystem::path& directory) const;

  std::filesystem::path root_;
  std::uint64_t step_;
  std::string writer_;
  std::vector<tensor_piece> pieces_;
};

} // namespace troupe
