#pragma once
// Checkpoint files: named tensors (a state_dict) plus string metadata.
//
// Layout (all integers little-endian):
//   [0, 8)    magic "TROUPECK"
//   [8, 12)   format version (1)
//   [12, 16)  reserved, 0
//   [16, 24)  index_bytes: size of the index frame (multiple of 8)
//   [24, 32)  payload_bytes: size of the payload region
//   index     a Cap'n Proto CheckpointIndex frame: per tensor its name, its
//             TensorHeader (validated by the data-plane decoder) and the
//             offset of its payload in the payload region (64-byte aligned)
//   padding   zeros up to a multiple of 64 bytes
//   payloads  dense row-major tensor bytes, each at a 64-byte aligned offset,
//             zero padding between them
//   trailer   CRC32C of every byte before it (u32), then "TEND"
//
// Writes go to `path.tmp`, are fsync'd and renamed over `path`, so a crash
// or failure never leaves a half-written checkpoint under `path` and never
// touches an existing one. Loads check magic, version and the sizes against
// the file length before allocating, then the checksum over everything, then
// every header; any failure returns an error and no tensors at all.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "troupe/serialization/fwd.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/named_tensors.hpp"

namespace troupe {

/// Free-form key/value strings stored beside the tensors (step, config, ...).
using checkpoint_metadata = std::vector<std::pair<std::string, std::string>>;

/// Limits for loading untrusted checkpoint files.
struct checkpoint_options {
  /// Largest accepted single tensor payload.
  std::uint64_t max_tensor_bytes = std::uint64_t{1} << 36;
  /// Largest accepted index frame (names and headers).
  std::uint64_t max_index_bytes = std::uint64_t{1} << 28;
  /// Largest accepted number of tensors.
  std::uint32_t max_entries = 1u << 20;
  std::uint32_t max_rank = 16;
};

/// What a checkpoint file holds. The tensors alias one buffer holding the
/// whole file (one read, no per-tensor copies); that buffer lives as long as
/// any of the tensors.
struct checkpoint_contents {
  named_tensors tensors;
  checkpoint_metadata metadata;
};

/// Writes `tensors` (CPU tensors; views are written densely) and `metadata`
/// atomically to `path`. Errors: errc::io_error naming the path and the OS
/// reason; errc::invalid_argument for a non-CPU tensor.
expected<void> save_checkpoint(const std::filesystem::path& path, const named_tensors& tensors,
                               const checkpoint_metadata& metadata = {});

/// Where one tensor's dense bytes lie inside a checkpoint file.
struct checkpoint_extent {
  std::uint64_t offset = 0; ///< from the start of the file; a multiple of 64
  std::uint64_t bytes = 0;
  std::uint32_t crc32c = 0; ///< of those bytes alone
};

/// save_checkpoint() that also says where each tensor's bytes landed, in the
/// order of `tensors`: a distributed checkpoint's manifest points at these
/// byte ranges (shard_writer.hpp), so a reader can fetch and check one piece
/// without reading the whole file.
expected<std::vector<checkpoint_extent>>
save_checkpoint_with_extents(const std::filesystem::path& path, const named_tensors& tensors,
                             const checkpoint_metadata& metadata = {});

/// Reads a checkpoint written by save_checkpoint(). Errors:
/// errc::io_error (missing or unreadable file, with the path),
/// errc::malformed_message (wrong magic, truncated, bad index),
/// errc::checksum_mismatch, errc::unsupported_dtype, errc::size_limit_exceeded.
expected<checkpoint_contents> read_checkpoint(const std::filesystem::path& path,
                                              const checkpoint_options& options = {});

/// read_checkpoint() without the metadata.
expected<named_tensors> load_checkpoint(const std::filesystem::path& path,
                                        const checkpoint_options& options = {});

/// Parses a whole checkpoint held in memory; the tensors share `file`.
expected<checkpoint_contents> parse_checkpoint(std::shared_ptr<storage> file,
                                               const checkpoint_options& options = {});

/// parse_checkpoint() over bytes the caller owns: copies them into one
/// aligned buffer first (for fuzzing and for bytes that arrived elsewhere).
expected<checkpoint_contents> parse_checkpoint(std::span<const std::byte> file,
                                               const checkpoint_options& options = {});

} // namespace troupe
