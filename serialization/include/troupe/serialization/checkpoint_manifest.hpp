#pragma once
// The manifest of a distributed checkpoint: every tensor by fully qualified
// name, its dtype and global shape, and the pieces it was saved in (each a
// box of the whole tensor, in a byte range of a shard file, with the CRC32C
// of those bytes), plus the driver's state (step, data position, random
// state) as opaque bytes. The coordinator writes it last
// (checkpoint_directory.hpp); a directory without one is not a checkpoint.
//
// File layout (all integers little-endian):
//   [0, 8)    magic "TROUPEMF"
//   [8, 12)   format version (1)
//   [12, 16)  reserved, 0
//   [16, 24)  frame_bytes: size of the Cap'n Proto CheckpointManifest frame
//   frame     the manifest (serialization/schema/troupe.capnp)
//   trailer   CRC32C of every byte before it (u32), then "MEND"
//
// A manifest is untrusted input: parse_manifest() checks the sizes against
// the file length before reading further, the checksum, and then that every
// tensor's pieces lie inside its global shape and tile it exactly (no gap,
// no overlap), with byte counts that match their shapes and shard file names
// that stay inside the checkpoint's directory.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "troupe/serialization/checkpoint_file.hpp"
#include "troupe/serialization/fwd.hpp"
#include "troupe/tensor/dtype.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/fwd.hpp"

namespace troupe {

/// One saved piece of a tensor: a box of the whole tensor and where its
/// dense row-major bytes lie.
struct checkpoint_piece {
  dims offset;                  ///< where the box starts, per dimension
  dims shape;                   ///< the box's extent, per dimension
  std::string file;             ///< a shard file in the checkpoint's directory
  std::uint64_t byte_offset = 0; ///< in that file
  std::uint64_t byte_count = 0;
  std::uint32_t crc32c = 0;     ///< of those bytes
};

/// One tensor of a checkpoint and the pieces it was saved in.
struct checkpoint_tensor {
  std::string name; ///< fully qualified ("stage1.fc1.weight", "optimizer.exp_avg.fc1.weight")
  dtype type = dtype::float32;
  dims global_shape;
  std::vector<checkpoint_piece> pieces;
};

/// What a manifest holds.
struct checkpoint_manifest {
  std::uint64_t step = 0;
  std::vector<checkpoint_tensor> tensors;
  /// The driver's state (data position, random state, config): values are
  /// opaque bytes.
  checkpoint_metadata metadata;
};

/// Limits for reading untrusted manifests.
struct manifest_options {
  std::uint64_t max_manifest_bytes = std::uint64_t{1} << 28;
  std::uint32_t max_tensors = 1u << 20;
  /// Pieces per tensor (their overlap check is quadratic in this).
  std::uint32_t max_pieces = 1u << 12;
  std::uint64_t max_piece_bytes = std::uint64_t{1} << 36;
  std::uint32_t max_rank = 16;
  /// Whether each tensor's pieces must tile it. Off for a writer's report
  /// (shard_writer.hpp), which holds only the pieces that writer wrote.
  bool require_tiling = true;
};

/// The file image of `manifest` (no validation: commit_checkpoint() checks
/// before it writes; tests forge bad manifests with this).
std::vector<std::byte> encode_manifest(const checkpoint_manifest& manifest);

/// Parses and validates a manifest file image. Errors name what was wrong:
/// errc::malformed_message (truncated, wrong magic, bad frame, a piece
/// outside its tensor, overlapping or missing pieces, a file name that
/// leaves the directory), errc::checksum_mismatch, errc::unsupported_dtype,
/// errc::size_limit_exceeded.
expected<checkpoint_manifest> parse_manifest(std::span<const std::byte> file,
                                             const manifest_options& options = {});

/// Reads and parses the manifest file at `path` (sizes checked against the
/// file length before the file is read in).
expected<checkpoint_manifest> read_manifest(const std::filesystem::path& path,
                                            const manifest_options& options = {});

} // namespace troupe
