#pragma once
// Loading a distributed checkpoint at any layout. A reader opens a
// checkpoint's manifest (checkpoint_manifest.hpp) and reads any region of
// any tensor, whatever layout it was saved in: it finds the saved pieces
// the region meets, reads each piece's byte range from its shard file,
// checks the piece's CRC32C, and copies the overlap into place. Saving at
// one split and loading at another (another dimension, degree, or the whole
// tensor) is resharding, and needs nothing more than this.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "troupe/serialization/checkpoint_manifest.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/named_tensors.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe {

/// A box of a tensor: where it starts and its extent, per dimension.
struct tensor_region {
  dims offset;
  dims shape;
};

class checkpoint_reader {
public:
  /// Opens the checkpoint in `directory` (a `step-<N>` directory, see
  /// latest_checkpoint()): reads and validates its manifest; reads no shard.
  static expected<checkpoint_reader> open(const std::filesystem::path& directory,
                                          const manifest_options& options = {});

  const std::filesystem::path& directory() const noexcept { return directory_; }
  const checkpoint_manifest& manifest() const noexcept { return manifest_; }
  std::uint64_t step() const noexcept { return manifest_.step; }
  /// The tensor named `name`, or nullptr.
  const checkpoint_tensor* find(std::string_view name) const;

  /// The whole tensor.
  expected<tensor> read(std::string_view name) const;
  /// `region` of the tensor, assembled from the pieces it meets. Errors:
  /// errc::state_mismatch (no such tensor), errc::invalid_argument (a region
  /// outside the tensor), and read_piece()'s.
  expected<tensor> read(std::string_view name, const tensor_region& region) const;
  /// Reads the region at `offset` of `destination`'s shape into
  /// `destination` (a contiguous CPU tensor, e.g. a parameter's shard).
  /// errc::state_mismatch when its dtype is not the saved one.
  expected<void> read_into(std::string_view name, const dims& offset, tensor& destination) const;
  /// Every tensor whole, in the manifest's order (to consolidate into one
  /// checkpoint file for one process).
  expected<named_tensors> read_all() const;

  /// The saved piece `piece` of `t` as a tensor of the piece's shape, after
  /// checking that its file holds its byte range and its CRC32C. Errors name
  /// the file and the tensor: errc::checksum_mismatch, errc::io_error,
  /// errc::malformed_message (a file too short for the piece).
  expected<tensor> read_piece(const checkpoint_tensor& t, std::size_t piece) const;
  /// Reads every piece of every tensor and checks its checksum; the first
  /// bad piece's error.
  expected<void> verify() const;

private:
  checkpoint_reader(std::filesystem::path directory, checkpoint_manifest manifest);

  std::filesystem::path directory_;
  checkpoint_manifest manifest_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
};

} // namespace troupe
